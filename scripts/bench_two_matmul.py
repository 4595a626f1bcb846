"""The two-matmul W0 kernel against ``policy_stats``: the target shape and a width sweep.

    OMP_NUM_THREADS=2 python scripts/bench_two_matmul.py docs/results/two_matmul

Runs the rows of ``python -m benchmarks signals`` that decide ``credit_core.work_path``'s
crossover (B x T = 4 x 1024, V = 32k; H = d = 16 ... 896, and H = 64 with d = 16) on 2 torch
threads, timed in interleaved rounds with the LM head, and writes ``signals.json`` and the
Markdown table ``signals.md`` to the output folder. About 3 minutes on 2 quiet CPU cores.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from benchmarks import report
from benchmarks.signals import TARGET_CASE, SignalCase, run

WIDTHS = ((16, 16), (32, 32), (64, 16), (64, 64), (128, 128), (256, 256))


def main(out: Path) -> None:
    torch.set_num_threads(2)
    out.mkdir(parents=True, exist_ok=True)
    cases = [TARGET_CASE, *(SignalCase(4, 1024, 32768, h, d) for h, d in WIDTHS)]
    start = time.perf_counter()
    section = run(
        cases, device=torch.device("cpu"), dtype=torch.float32, repeats=5, measure_memory=False
    )
    section["wall_s"] = time.perf_counter() - start
    (out / "signals.json").write_text(json.dumps(section, indent=1, default=str))
    table = "\n".join(report.signals_table(section))
    (out / "signals.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/bench_two_matmul"))
