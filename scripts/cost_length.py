"""Signal-phase cost against response length, encoder and causal reward models, in one run.

    python scripts/cost_length.py [--lengths 24 96 192] [--rm encoder causal]
        [--strategies uniform "{name: datc, beta: 0.5, lam: 0.5}" ...] [--steps 8]
        [--family llama] [--cache .cache/ablate] [--out runs/cost_length]

For each response length L and reward-model kind, one ``GRPORecipe`` per strategy is built
in this process on setting 9's task at L (``length_sweep``, ablations/length_task.py: its
pretrained policy, prompts and RM, from the ablation cache, built there if missing), with
the RM as the run's reward (an RLHF run's shape: ``uniform`` pays one RM forward too):

- ``encoder``: setting 9's tiny BERT, trained on the rule (hidden 64, 2 layers); ``red``'s
  prefix rewards take n + 1 scoring passes (``adapters.direction``, ``prefix_scores``);
- ``causal``: a tiny Llama classifier of the same width and depth over the policy's own
  vocabulary, no template suffix, left padding, so every prefix's score comes off the one
  reward forward (``ScoreHeadOutputs``); untrained: the cost does not depend on its weights.

The recipes' ``train_step`` calls alternate, the order rotating every round (as
``benchmarks.step``), so a slow phase of the machine hits every strategy alike. Reported per
(L, kind, strategy): the median over ``--steps`` timed steps (after ``--warmup``) of the
trainer's own ``time/signals`` and of its reward-model part ``time/signals_reward``, and the
peak extra resident memory of the signal phase: one more step per strategy with its
``signals`` call wrapped, the kernel's peak-RSS counter reset before it
(``/proc/self/clear_refs``) and VmHWM - VmRSS(before) read after it (Linux; the process runs
with glibc's mmap threshold fixed at 1 MiB, as ``benchmarks.memory``'s children do, so that
freed blocks are returned and the peak is the phase's own). The mean response length is
reported beside them (the pretrained policy writes about L words).

Writes ``results.json`` (every timed step), ``table.md`` and ``cost_length.png`` into
``--out``. The strategy list is a parameter (``--strategies``, each a name or a YAML mapping
as a ``credit:`` entry takes), so strategies added later run the same way. The default list
adds P2T, KTAE, OAR-G (its answer span: the last word) and PRIME to #29's five; OAR-G's
extra policy forward and backward is in its signal phase, PRIME's pi_phi update is not (it
runs after the credit, in the update phase). Timings are
only comparable on a quiet machine; the committed figures come from

    OMP_NUM_THREADS=1 python scripts/cost_length.py --steps 8 \
        --out docs/results/cost_length

(about 5 min with the assets cached; ``--steps 3`` took 3.4 min on a shared machine).
Exit status 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MMAP_THRESHOLD = str(2**20)
DEFAULT_STRATEGIES = (
    "uniform",
    "{name: datc, beta: 0.5, lam: 0.5}",
    "{name: datc_mid, beta: 0.5, lam: 0.5}",
    "red",
    "{name: abc, beta: 0.5}",
    "p2t",
    "ktae",
    "oar_g",
    "prime",
)
RM_KINDS = ("encoder", "causal")


@dataclass
class Cell:
    """One (length, RM kind, strategy): per-step seconds, the signal phase's peak extra
    bytes (None where not measurable), and mean response lengths."""

    length: int
    rm: str
    strategy: str
    signals_s: list[float] = field(default_factory=list)
    reward_s: list[float] = field(default_factory=list)
    response_len: list[float] = field(default_factory=list)
    peak_bytes: int | None = None

    @property
    def median_signals(self) -> float:
        return statistics.median(self.signals_s)

    @property
    def median_reward(self) -> float:
        return statistics.median(self.reward_s)


def _parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[24, 96, 192])
    parser.add_argument("--rm", nargs="+", choices=RM_KINDS, default=list(RM_KINDS))
    parser.add_argument(
        "--strategies",
        nargs="+",
        default=list(DEFAULT_STRATEGIES),
        help="credit strategies: a name or a YAML mapping ({name: datc, beta: 0.5})",
    )
    parser.add_argument("--steps", type=int, default=8, help="timed steps per strategy")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    parser.add_argument("--family", default="llama", choices=["llama", "qwen2", "gpt2"])
    parser.add_argument("--cache", default=".cache/ablate", help="the ablation cache")
    parser.add_argument("--out", default="runs/cost_length")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        parser.error("--steps must be >= 1 and --warmup >= 0")
    return args


# ------------------------------------------------------------------------------ building


def _causal_rm(cache: Path, words: list[str], hidden: int, layers: int, heads: int) -> Path:
    """A cached untrained tiny Llama classifier over ``words`` (the policy's vocabulary)."""
    from ablations import word_tasks
    from adapters.folder_cache import cached_dir
    from adapters.tiny import tiny_seq_classifier

    def build(folder: Path) -> None:
        tok = word_tasks.word_tokenizer(words)  # no template: no suffix after the response
        model: Any = tiny_seq_classifier(
            "llama",
            len(tok),
            hidden=hidden,
            layers=layers,
            heads=heads,
            seed=0,
            pad_token_id=tok.pad_token_id,
        )
        model.requires_grad_(False)
        model.save_pretrained(folder)
        tok.save_pretrained(folder)

    spec = {"cost_length_causal_rm": 1, "words": words, "shape": [hidden, layers, heads]}
    return cached_dir(cache, "rm", spec, build)


def _recipes(
    length: int, rm: str, strategies: Sequence[Any], args: argparse.Namespace, tmp: Path
) -> dict[str, Any]:
    """label -> a fresh ``GRPORecipe`` of setting 9 at ``length`` with the ``rm`` kind."""
    from ablations import word_tasks
    from ablations.ablation_config import AblateConfig
    from ablations.results import RunKey
    from ablations.runner import run_train_config
    from backends.torch.trainer import GRPORecipe, resolve_config
    from credit_core.registry import strategy_class

    cfg = AblateConfig.model_validate(
        {
            "cache_dir": args.cache,
            "families": [args.family],
            "seeds": [0],
            "strategies": list(strategies),
            "settings": {"sweep": {"kind": "length_sweep", "params": {"response_len": length}}},
            "train": {
                "rollout": {"group_size": 8, "prompts_per_step": 4, "top_k": 0, "top_p": 1.0},
                "algorithm": {"micro_batch_size": 32, "kl_coef": 0.0},
                "optim": {"lr": 3.0e-4, "schedule": "constant"},
            },
        }
    )
    params = cfg.setting_params("sweep")
    assets = cfg.setting_kind("sweep").build(params, args.family, Path(args.cache))
    if rm == "encoder":
        direction = dict(assets.reward["direction_model"])
    else:
        path = _causal_rm(
            Path(args.cache),
            word_tasks.target_words(),
            params.rm.hidden,
            params.rm.layers,
            params.rm.heads,
        )
        direction = {"kind": "seq_classification", "path": str(path)}
    reward = {"direction_model": direction}  # the RM's own reward sets the advantage
    out = {}
    for s in cfg.strategies:
        run = RunKey("sweep", args.family, s.label, 0)
        raw = run_train_config(cfg, run, assets, tmp / f"{length}_{rm}_{s.label}")
        if strategy_class(s.credit.name).reads_answer_span:  # OAR-G: the last word answers
            raw.setdefault("data", {})["answer_span"] = {"last": 1}
        raw.update(
            reward=reward,
            steps=1_000_000,
            eval={"interval": 0},
            checkpoint={"interval": 0},
        )
        out[s.label] = GRPORecipe(resolve_config(raw))
    return out


# --------------------------------------------------------------------------- measuring


def _rss_meter(recipe: Any, peaks: list[int]) -> Callable[[], None]:
    """Wrap ``recipe.signals`` so that each call appends its peak extra RSS (bytes) to
    ``peaks``; returns the function that removes the wrapper."""
    import gc

    from benchmarks.memory import _status_kib

    inner = recipe.signals

    def signals(*a: Any, **k: Any) -> Any:
        gc.collect()
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        before = _status_kib("VmRSS")
        out = inner(*a, **k)
        peaks.append((_status_kib("VmHWM") - before) * 1024)
        return out

    recipe.signals = signals
    return lambda: vars(recipe).pop("signals", None)


def measure(
    length: int, rm: str, strategies: Sequence[Any], args: argparse.Namespace, tmp: Path
) -> list[Cell]:
    """The cells of one (length, RM kind): alternated timed steps, then one metered step."""
    from benchmarks.memory import rss_peak_supported

    recipes = _recipes(length, rm, strategies, args, tmp)
    names = list(recipes)
    cells = {n: Cell(length, rm, n) for n in names}
    try:
        for r in range(args.warmup + args.steps):
            k = r % len(names)
            for name in names[k:] + names[:k]:
                metrics = recipes[name].train_step()
                if r >= args.warmup:
                    cell = cells[name]
                    cell.signals_s.append(float(metrics["time/signals"]))
                    cell.reward_s.append(float(metrics["time/signals_reward"]))
                    cell.response_len.append(float(metrics.get("response/length_mean", math.nan)))
        if rss_peak_supported():
            for name in names:
                peaks: list[int] = []
                unwrap = _rss_meter(recipes[name], peaks)
                try:
                    recipes[name].train_step()
                finally:
                    unwrap()
                cells[name].peak_bytes = max(peaks)
    finally:
        for recipe in recipes.values():
            recipe.logger.close()
            recipe.close()
    return [cells[n] for n in names]


# ---------------------------------------------------------------------------- outputs


def table(cells: Sequence[Cell], strategies: Sequence[str]) -> str:
    """Markdown: one row per (RM kind, length), per strategy the median signal-phase s/step
    [its RM part] and the phase's peak extra MiB."""
    by = {(c.rm, c.length, c.strategy): c for c in cells}
    keys = sorted({(c.rm, c.length) for c in cells}, key=lambda k: (RM_KINDS.index(k[0]), k[1]))
    head = "| RM | length (mean response) | " + " | ".join(f"`{s}`" for s in strategies) + " |"
    lines = [head, "|---|---|" + "---|" * len(strategies)]
    for rm, length in keys:
        row = [c for s in strategies if (c := by.get((rm, length, s))) is not None]
        mean_len = statistics.fmean(x for c in row for x in c.response_len)
        out = [rm, f"{length} ({mean_len:.0f})"]
        for s in strategies:
            c = by.get((rm, length, s))
            if c is None:
                out.append("-")
                continue
            mib = "n/a" if c.peak_bytes is None else f"{c.peak_bytes / 2**20:.1f} MiB"
            out.append(f"{c.median_signals:.4f} s [RM {c.median_reward:.4f}], {mib}")
        lines.append("| " + " | ".join(out) + " |")
    return "\n".join(lines) + "\n"


def figure(cells: Sequence[Cell], strategies: Sequence[str], path: Path) -> None:
    """Signal-phase s/step (log scale) and peak extra MiB (linear) against length (log 2),
    one column per RM kind."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = [k for k in RM_KINDS if any(c.rm == k for c in cells)]
    fig, axes = plt.subplots(2, len(kinds), figsize=(5.5 * len(kinds), 7), squeeze=False)
    for j, rm in enumerate(kinds):
        for s in strategies:
            mine = sorted(
                (c for c in cells if c.rm == rm and c.strategy == s), key=lambda c: c.length
            )
            if not mine:
                continue
            xs = [c.length for c in mine]
            axes[0][j].plot(xs, [c.median_signals for c in mine], marker="o", label=s)
            if all(c.peak_bytes is not None for c in mine):
                axes[1][j].plot(
                    xs, [(c.peak_bytes or 0) / 2**20 for c in mine], marker="o", label=s
                )
        axes[0][j].set_title(f"{rm} RM: signal phase, s/step (median)")
        axes[1][j].set_title(f"{rm} RM: signal phase, peak extra RSS (MiB)")
        axes[0][j].set_yscale("log")
        lengths = sorted({c.length for c in cells})
        for ax in (axes[0][j], axes[1][j]):
            ax.set_xlabel("response length (tokens)")
            ax.set_xscale("log", base=2)
            ax.set_xticks(lengths, [str(n) for n in lengths])
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str]) -> int:
    args = _parse_args(argv)
    import torch
    import yaml

    from ablations.ablation_config import StrategyConfig

    try:
        strategies = [StrategyConfig.parse(yaml.safe_load(s)) for s in args.strategies]
    except (ValueError, yaml.YAMLError) as exc:
        print(f"cost_length: error: --strategies: {exc}", file=sys.stderr)
        return 2
    labels = [s.label for s in strategies]
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cells: list[Cell] = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="cost-length-") as tmp:
        for length in args.lengths:
            for rm in args.rm:
                t0 = time.perf_counter()
                cells.extend(measure(length, rm, strategies, args, Path(tmp)))
                print(f"[cost_length] length {length}, {rm} RM: {time.perf_counter() - t0:.1f}s")
    meta = {
        "command": "python scripts/cost_length.py " + " ".join(argv),
        "threads": 1,
        "cpu_count": os.cpu_count(),
        "wall_s": time.perf_counter() - start,
        "mmap_threshold": os.environ.get("MALLOC_MMAP_THRESHOLD_"),
    }
    (out / "results.json").write_text(
        json.dumps({"meta": meta, "cells": [asdict(c) for c in cells]}, indent=1)
    )
    (out / "table.md").write_text(table(cells, labels))
    figure(cells, labels, out / "cost_length.png")
    print(table(cells, labels))
    print(f"[cost_length] wrote {out}/results.json, table.md, cost_length.png")
    return 0


if __name__ == "__main__":
    if sys.platform == "linux" and os.environ.get("MALLOC_MMAP_THRESHOLD_") != MMAP_THRESHOLD:
        # glibc reads it at start-up only: run again with it set (benchmarks.memory explains)
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD}
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    sys.exit(main(sys.argv[1:]))
