"""``credit-view RUN_DIR [-o PAGE.html]``: the credit samples of a run, or of an ablation, as one
self-contained HTML page (``backends.samples.page``).

``RUN_DIR`` is a run folder of ``credit-train`` or ``credit-trl`` (it holds
``credit_samples.jsonl``), or a folder with runs below it: an ablation output folder
(``runs/<setting>/<family>/<strategy>/seed<k>/train/``) shows each setting, family and seed
as a group with its strategies side by side; any other layout shows each run under its
path. The page goes to ``RUN_DIR/credit_view.html`` unless ``-o`` says where.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

from backends.common.cli import CommandError, add_debug_argument, run_cli
from backends.samples.page import RunSamples, render_page
from backends.samples.records import SAMPLES_FILE, read_samples

PROG = "credit-view"
PAGE_FILE = "credit_view.html"

#: The ablation runner's run folders below its output folder (``ablations.results``).
ABLATION_RUNS = "runs"


def find_runs(folder: Path) -> list[RunSamples]:
    """The runs with credit samples at or below ``folder`` (see the module docstring);
    ``CommandError`` when there is none or a samples file is not one."""
    if not folder.is_dir():
        raise CommandError(f"RUN_DIR: {str(folder)!r} is not a folder")
    own = folder / SAMPLES_FILE
    files = [own] if own.is_file() else sorted(folder.rglob(SAMPLES_FILE))
    if not files:
        raise CommandError(
            f"RUN_DIR: no {SAMPLES_FILE} in or below {str(folder)!r}; expected a run folder of "
            "credit-train or credit-trl, or an ablation output folder, whose runs recorded "
            "credit samples (credit_samples.interval > 0, or evaluations with the default)"
        )
    runs = []
    for file in files:
        try:
            records = read_samples(file)
        except ValueError as exc:
            raise CommandError(
                f"{exc}; expected records written by credit-train or credit-trl"
            ) from None
        parts = file.parent.relative_to(folder).parts
        if len(parts) >= 5 and parts[0] == ABLATION_RUNS:  # runs/setting/family/strategy/seed
            group, name = " · ".join((parts[1], parts[2], parts[4])), parts[3]
        else:
            strategy = records[0].strategy if records else "no records"
            group, name = "", " · ".join([*parts, strategy]) if parts else strategy
        runs.append(RunSamples(name=name, group=group, records=records))
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``credit-view``; the exit status (2: an expected error such as a
    folder without samples, one message; ``--debug`` shows its traceback)."""
    return run_cli(PROG, _view, argv)


def _view(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Write one self-contained HTML page of a run's credit samples "
        "(token heat-maps by step, strategies side by side).",
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", type=Path, help="run or ablation folder")
    parser.add_argument(
        "-o", "--output", type=Path, help=f"page to write (default: RUN_DIR/{PAGE_FILE})"
    )
    add_debug_argument(parser)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    runs = find_runs(args.run_dir)
    out: Path = args.output or args.run_dir / PAGE_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_page(runs, title=f"credit samples: {args.run_dir}"), encoding="utf-8")
    steps = len({r.step for run in runs for r in run.records})
    print(
        f"credit-view: {out} ({out.stat().st_size / 1e6:.2f} MB, {len(runs)} run(s), "
        f"{steps} step(s), {time.perf_counter() - start:.1f} s)"
    )
    return 0
