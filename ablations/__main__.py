"""``python -m ablations CONFIG.yaml [--set k=v ...] [--shard i/n] [--debug]`` and
``python -m ablations merge CONFIG.yaml --from DIR [DIR ...] [--rows CSV ...] [--set ...]
[--debug]`` and ``python -m ablations check CONFIG --sample N [--seed S] [--tolerance T]
[--rows CSV ...] [--set ...] [--debug]`` and ``python -m ablations bank CONFIG [--set ...]``.

The first trains the config's runs (this shard's share with ``--shard``; finished runs are
skipped) and, for the whole plan, writes report.md, results.csv and the figures, then prints
their paths. ``merge`` gathers shard output folders into the config's output folder and
writes the same outputs. ``check`` reruns N recorded runs drawn at random and compares
their final metrics with the recorded ones (``ablations.check``): one line per run and a
summary; exit status 0 when every rerun is identical within the tolerance, 1 when some
differ. ``bank`` adds the finished runs of the output folder to the config's first ``banked`` folder
(``ablations.bank``: a plan trained over several sessions; the runner takes banked runs made
with the config as its own). Expected failures (bad config, missing file, package or GPU)
print one message and exit with status 2 (``backends.common.cli``); a failed run is a bug
until shown otherwise and raises with its traceback. A worker process that dies, fails or
hangs ends the runner with one message naming it and its run (status 2); a stop signal
(SIGTERM, SIGUSR1) ends the run in progress after its step and the command with one line
and status 75 (``backends.common.preemption``). Finished runs are kept: the same command
continues.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from backends.common.cli import add_debug_argument, run_cli
from backends.common.errors import ConfigError
from backends.common.preemption import PREEMPTED_EXIT
from backends.torch.config import add_override_argument, check_device

if TYPE_CHECKING:
    from ablations.ablation_config import AblateConfig

PROG = "credit-ablate"


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="ablation config (YAML), e.g. configs/ablate/quick.yaml")
    add_override_argument(parser, "seeds=[0,1,2]")
    add_debug_argument(parser)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        usage="%(prog)s CONFIG [--set KEY=VALUE ...] [--shard I/N] [--debug]\n"
        "       %(prog)s merge CONFIG --from DIR [DIR ...] [--rows CSV ...] [--set KEY=VALUE ...]\n"
        "       %(prog)s check CONFIG --sample N [--seed S] [--tolerance T] [--rows CSV ...]\n"
        "       %(prog)s bank CONFIG [--set KEY=VALUE ...]",
        description="Train the same policy under several credit strategies across settings, "
        "families and seeds; report the comparison. Subcommand 'merge' combines shards; "
        "'check' reruns a sample of recorded runs and compares them.",
    )
    _common(parser)
    parser.add_argument("--shard", default="0/1", help="run only slice i of n (e.g. 0/2)")
    parser.add_argument(
        "--assets-only",
        action="store_true",
        help="only build this shard's share of the settings' models and data",
    )
    return parser


def build_merge_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"{PROG} merge",
        description="Combine the output folders of shards into the config's output folder "
        "and write report.md, results.csv and the figures.",
    )
    _common(parser)
    parser.add_argument(
        "--from",
        dest="sources",
        nargs="+",
        required=True,
        metavar="DIR",
        help="output folders of the shards",
    )
    parser.add_argument(
        "--rows",
        dest="earlier",
        nargs="+",
        default=[],
        metavar="CSV",
        help="results.csv files of earlier runs of this config: a planned run that no "
        "folder holds is taken from their rows as written (the report counts them)",
    )
    return parser


def build_check_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"{PROG} check",
        description="Rerun a random sample of the config's recorded runs and compare their "
        "final metrics with the record (exit 0: all identical, 1: some differ).",
    )
    _common(parser)
    parser.add_argument("--sample", type=int, required=True, metavar="N", help="runs to rerun")
    parser.add_argument("--seed", type=int, default=0, help="seed of the draw (default 0)")
    parser.add_argument(
        "--tolerance",
        type=float,
        default=0.0,
        help="largest absolute difference counted as identical (default 0: the same "
        "results.csv cells)",
    )
    parser.add_argument(
        "--rows",
        dest="earlier",
        nargs="+",
        default=[],
        metavar="CSV",
        help="draw from the runs of these results.csv files (the rows `merge --rows` would "
        "carry over) instead of the config's output folder",
    )
    return parser


def build_bank_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"{PROG} bank",
        description="Add the finished runs of the config's output folder to its bank "
        "(the config's 'banked' folder): one new file, the earlier ones untouched.",
    )
    _common(parser)
    return parser


def _bank(args_in: list[str]) -> int:
    from ablations.ablation_config import load_ablate_config
    from ablations.runner import deposit_banked

    args = build_bank_parser().parse_args(args_in)
    cfg = load_ablate_config(args.config, args.overrides)
    file, finished, planned = deposit_banked(cfg)
    added = f"wrote {file}" if file is not None else "nothing new to add"
    print(
        f"bank {cfg.banked[0]}: {added}; {finished} of {planned} runs finished in the output folder"
    )
    return 0


def _check(args_in: list[str]) -> int:
    from ablations.ablation_config import load_ablate_config
    from ablations.check import check_sample

    args = build_check_parser().parse_args(args_in)
    cfg = load_ablate_config(args.config, args.overrides)
    _check_devices(cfg)
    compared = check_sample(
        cfg,
        sample=args.sample,
        seed=args.seed,
        tolerance=args.tolerance,
        rows=[Path(p) for p in args.earlier],
        log=lambda m: print(m, flush=True),
    )
    return 0 if all(c.identical for c in compared) else 1


def _check_devices(cfg: AblateConfig) -> None:
    """Stop at once when a ``train`` section asks for CUDA on a machine without it."""
    check_device(cfg.train.get("device", "auto"), "train.device")
    for name, spec in cfg.settings.items():
        check_device(spec.train.get("device", "auto"), f"settings.{name}.train.device")


def _ablate(args_in: list[str]) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    from ablations.ablation_config import load_ablate_config
    from ablations.results import parse_shard
    from ablations.runner import Outputs, merge, run_ablation, run_workers
    from ablations.supervision import RunStoppedError

    command = "python -m ablations " + shlex.join(args_in)
    outputs: Outputs | None
    if args_in[:1] == ["check"]:
        return _check(args_in[1:])
    if args_in[:1] == ["bank"]:
        return _bank(args_in[1:])
    if args_in[:1] == ["merge"]:
        args = build_merge_parser().parse_args(args_in[1:])
        cfg = load_ablate_config(args.config, args.overrides)
        outputs = merge(
            cfg,
            [Path(p) for p in args.sources],
            command=command,
            earlier=[Path(p) for p in args.earlier],
        )
    else:
        args = build_parser().parse_args(args_in)
        try:
            index, count = parse_shard(args.shard)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        cfg = load_ablate_config(args.config, args.overrides)
        _check_devices(cfg)
        tag = f"[shard {index}/{count}] " if count > 1 else ""

        def log(message: str) -> None:
            print(tag + message, flush=True)

        try:
            if cfg.workers > 1 and count == 1 and not args.assets_only:
                outputs = run_workers(cfg, command=command, log=log)
            else:
                outputs = run_ablation(
                    cfg,
                    command=command,
                    shard_index=index,
                    shard_count=count,
                    log=log,
                    assets_only=args.assets_only,
                )
        except RunStoppedError as exc:
            print(f"{PROG}: {tag}{exc}", file=sys.stderr, flush=True)
            return PREEMPTED_EXIT
    if outputs is not None:
        print(f"report:  {outputs.report}")
        print(f"results: {outputs.csv}")
        for fig in outputs.figures:
            print(f"figure:  {fig}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``credit-ablate``; the exit status (2: an expected error, one message;
    ``--debug`` shows its traceback)."""
    return run_cli(PROG, _ablate, argv, expected=(ConfigError,))


if __name__ == "__main__":
    sys.exit(main())
