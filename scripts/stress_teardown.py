"""Stress the end of multi-process runs: the README's two-process line, many times, under load.

    python scripts/stress_teardown.py --runs 30 --load 1 --out docs/results/teardown

Runs ``torchrun --standalone --nproc_per_node 2 -m backends.torch configs/torch/tiny_datc.yaml``
``--runs`` times for each of DDP and FSDP (``distributed.strategy``; FSDP compares the credit
samples with ``uniform`` only, as ``datc_mid`` is refused there), each in a fresh output
folder, while ``--load`` busy processes keep the cores loaded; a run that has not exited
``--timeout`` seconds after its start counts as hung and is killed (its process tree).
Prints one line per run and writes ``report.md`` and ``runs.csv`` to ``--out``. Exit status
0 if every run exited by itself with status 0, 1 otherwise.
"""

from __future__ import annotations

import argparse
import csv
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "torch" / "tiny_datc.yaml"


def _busy() -> None:
    while True:
        pass


def one_run(strategy: str, folder: Path, timeout: float) -> tuple[str, float, int | None]:
    """(outcome, seconds, exit status) of one two-process run: ok, failed or hung."""
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [
        str(torchrun),
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "backends.torch",
        str(CONFIG),
        "--set",
        f"output_dir={folder}",
        "--set",
        f"distributed.strategy={strategy}",
        "--set",
        "logging.progress=false",
    ]
    if strategy == "fsdp":  # the config's datc_mid credit samples need the policy unsharded
        command += ["--set", "credit_samples.compare=[uniform]"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.monotonic()
    proc = subprocess.Popen(
        command,
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        status = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return "hung", time.monotonic() - start, None
    return ("ok" if status == 0 else "failed"), time.monotonic() - start, status


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30, help="runs per strategy")
    parser.add_argument("--load", type=int, default=2, help="busy processes beside the runs")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds before 'hung'")
    parser.add_argument("--strategies", default="ddp,fsdp")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "stress_teardown")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    load = [multiprocessing.Process(target=_busy, daemon=True) for _ in range(args.load)]
    for p in load:
        p.start()
    rows: list[dict[str, object]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for strategy in args.strategies.split(","):
                for i in range(args.runs):
                    outcome, seconds, status = one_run(
                        strategy, Path(tmp) / f"{strategy}{i}", args.timeout
                    )
                    rows.append(
                        {
                            "strategy": strategy,
                            "run": i,
                            "outcome": outcome,
                            "seconds": round(seconds, 2),
                            "status": status,
                        }
                    )
                    print(
                        f"{strategy} {i + 1}/{args.runs}: {outcome} in {seconds:.1f}s "
                        f"(status {status})",
                        flush=True,
                    )
    finally:
        for p in load:
            p.terminate()
    with open(args.out / "runs.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    lines = [
        f"# Teardown stress: `{' '.join(sys.argv)}`",
        "",
        f"{args.runs} runs per strategy of the README's two-process line, {args.load} busy "
        f"processes beside them on {os.cpu_count()} cores, {args.timeout:g} s before a run "
        "counts as hung.",
        "",
        "| strategy | runs | exited 0 | failed | hung | median s | max s |",
        "|---|---|---|---|---|---|---|",
    ]
    for strategy in args.strategies.split(","):
        mine = [r for r in rows if r["strategy"] == strategy]
        secs = [float(str(r["seconds"])) for r in mine if r["outcome"] != "hung"]
        count = {o: sum(r["outcome"] == o for r in mine) for o in ("ok", "failed", "hung")}
        lines.append(
            f"| {strategy} | {len(mine)} | {count['ok']} | {count['failed']} | {count['hung']} "
            f"| {statistics.median(secs) if secs else float('nan'):.1f} "
            f"| {max(secs) if secs else float('nan'):.1f} |"
        )
    (args.out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all(r["outcome"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
