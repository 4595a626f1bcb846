"""Compare runs redone with today's code to the rows of a committed results.csv.

    python scripts/compare_reruns.py CONFIG OUTPUT_DIR COMMITTED_CSV [--set KEY=VALUE ...]

For every run of CONFIG (after the overrides) whose folder under OUTPUT_DIR holds a result
made with this config, its results.csv rows (written and read back, so rounded as the file
rounds them) are compared with the committed rows of the same run, every column but the
timings (which are measurements). Prints one line per run and a summary; exit status 1
when any run differs, 2 on bad input.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from ablations.ablation_config import load_ablate_config
from ablations.results import TIMING_COLUMNS, collect, read_csv, result_rows, write_csv
from ablations.runner import fingerprints, plan_runs
from ablations.summary import group_runs


def _untimed(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    return [{k: v for k, v in r.items() if k not in TIMING_COLUMNS} for r in rows]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("output_dir")
    parser.add_argument("committed_csv")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    cfg = load_ablate_config(args.config, [*args.overrides, f"output_dir={args.output_dir}"])
    plan = plan_runs(cfg)
    found, _ = collect(plan, Path(args.output_dir), fingerprints(cfg, plan))
    committed = group_runs(read_csv(args.committed_csv))
    differ = 0
    with tempfile.TemporaryDirectory() as tmp:
        for run, result in sorted(found.items()):
            if run not in committed:
                continue
            path = Path(tmp) / "run.csv"
            write_csv(path, result_rows(run, result))
            mine, theirs = _untimed(read_csv(path)), _untimed(committed[run])
            same = mine == theirs
            differ += not same
            print(f"{'same   ' if same else 'DIFFERS'} {run.relpath}")
    compared = sum(run in committed for run in found)
    print(f"{compared - differ} of {compared} rerun runs equal their committed rows")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
