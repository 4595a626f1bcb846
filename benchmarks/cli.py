"""``python -m benchmarks`` (console script ``credit-bench``): run, then write JSON + Markdown.

    python -m benchmarks                      # all three benchmarks, default sizes
    python -m benchmarks signals --quick      # one benchmark, small sizes (CI)
    python -m benchmarks --out runs/bench --device cuda
    python -m benchmarks tiles compile        # only when named: tile sizes, torch.compile

Writes ``OUT/results.json`` (everything measured), ``OUT/results.md`` (the tables and the
targets) and ``OUT/vocab.png`` (``policy_stats`` time and memory against V).
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from backends.common.cli import CommandError, add_debug_argument, run_cli
from benchmarks import report

PROG = "credit-bench"

BENCHMARKS = ("signals", "reward", "step")
#: Run only when named: the tile-size sweep behind ``policy_stats``' defaults, and
#: ``policy_stats`` eager against ``torch.compile``.
EXTRA = ("tiles", "compile")
#: The default mode must finish within this many seconds on the project's CPU machines.
DEFAULT_MODE_BUDGET_S = 600.0


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Cost of token credit assignment over plain GRPO: signals, reward "
        "gradient, full step. Writes results.json, results.md and vocab.png to --out.",
    )
    parser.add_argument(
        "benchmarks",
        nargs="*",
        choices=[*BENCHMARKS, *EXTRA, []],
        metavar="BENCHMARK",
        help=f"which to run, any of {', '.join(BENCHMARKS + EXTRA)} "
        f"(default: {', '.join(BENCHMARKS)})",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, seconds (CI)")
    parser.add_argument("--out", type=Path, default=Path("runs/bench"), help="output folder")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16"],
        default="auto",
        help="signals inputs (hidden, LM head, E); auto: bfloat16 on CUDA, float32 on CPU",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument(
        "--repeats", type=int, default=None, help="timed calls per function (default 3; 2 quick)"
    )
    parser.add_argument(
        "--pairs", type=int, default=None, help="paired steps per strategy (default 25; 2 quick)"
    )
    parser.add_argument(
        "--step-threads",
        type=int,
        default=None,
        help="torch threads during the step benchmark (default on CPU: 1, the tiny models' "
        "ops are too small to split, and on a shared CPU every split op waits for its worker)",
    )
    parser.add_argument("--no-memory", action="store_true", help="skip peak-memory measurements")
    add_debug_argument(parser)
    args = parser.parse_args(list(argv))
    args.benchmarks = list(dict.fromkeys(args.benchmarks)) or list(BENCHMARKS)
    for name in ("threads", "repeats", "pairs", "step_threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            flag = name.replace("_", "-")
            parser.error(f"--{flag}: expected an integer >= 1, got {value}")
    return args


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise CommandError(
            "--device cuda: this machine has no usable CUDA device "
            "(torch.cuda.is_available() is False); use --device cpu or --device auto"
        )
    return torch.device(name)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _load() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``credit-bench``; the exit status (2: an expected error such as a
    missing GPU or package, one message; ``--debug`` shows its traceback)."""
    return run_cli(PROG, _bench, argv)


def _bench(argv: list[str]) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = _device(args.device)
    dtype_name = args.dtype
    if dtype_name == "auto":
        dtype_name = "bfloat16" if device.type == "cuda" else "float32"
    dtype = getattr(torch, dtype_name)
    repeats = args.repeats or (2 if args.quick else 3)
    pairs = args.pairs or (2 if args.quick else 25)
    started = time.perf_counter()
    results: dict[str, Any] = {
        "command": " ".join(["python -m benchmarks", *argv]),
        "environment": {
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name(),
            "device_type": device.type,
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "dtype": dtype_name,
            "load_start": _load(),
        },
        "quick": args.quick,
    }

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] {msg}", flush=True)

    targets: list[dict[str, Any]] = []
    if "signals" in args.benchmarks:
        from benchmarks import signals

        cases = signals.QUICK_CASES if args.quick else signals.FULL_CASES
        results["signals"] = signals.run(
            cases,
            device=device,
            dtype=dtype,
            repeats=repeats,
            measure_memory=not args.no_memory,
            log=log,
        )
        targets += results["signals"]["targets"]
    if "tiles" in args.benchmarks:
        from benchmarks import signals

        tile_cases = signals.QUICK_CASES if args.quick else signals.TILE_CASES
        results["tiles"] = signals.run_tiles(
            tile_cases, device=device, dtype=dtype, repeats=repeats, log=log
        )
    if "compile" in args.benchmarks:
        from benchmarks import signals

        compile_cases = signals.QUICK_CASES[:1] if args.quick else signals.TILE_CASES
        results["compile"] = signals.run_compile(
            compile_cases, device=device, dtype=dtype, repeats=repeats, log=log
        )
    if "reward" in args.benchmarks:
        from benchmarks import reward_grad

        cases_r = reward_grad.QUICK_CASES if args.quick else reward_grad.FULL_CASES
        results["reward"] = reward_grad.run(
            cases_r, device=device, repeats=max(3, 2 * repeats), log=log
        )
    if "step" in args.benchmarks:
        from benchmarks import step

        configs = step.QUICK_CONFIGS if args.quick else step.FULL_CONFIGS
        threads = args.step_threads or (1 if device.type == "cpu" else torch.get_num_threads())
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            results["step"] = step.run(configs, device=device, pairs=pairs, log=log)
        finally:
            torch.set_num_threads(before)
        results["step"]["threads"] = threads
        targets += results["step"]["targets"]
    results["wall_seconds"] = time.perf_counter() - started
    results["environment"]["load_end"] = _load()
    if not args.quick and set(args.benchmarks) == set(BENCHMARKS):
        targets.append(
            {
                "target": f"default mode finishes in {DEFAULT_MODE_BUDGET_S / 60:.0f} minutes",
                "measured": f"{results['wall_seconds']:.0f} s",
                "holds": results["wall_seconds"] < DEFAULT_MODE_BUDGET_S,
            }
        )
    results["targets"] = targets
    out: Path = args.out
    report.write_json(results, out / "results.json")
    markdown = report.markdown(results)
    (out / "results.md").write_text(markdown)
    written = [out / "results.json", out / "results.md"]
    if "signals" in results and report.plot_vocab(results["signals"], out / "vocab.png"):
        written.append(out / "vocab.png")
    print(markdown)
    log("wrote " + ", ".join(str(p) for p in written))
    return 0
