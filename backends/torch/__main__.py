"""``credit-train CONFIG.yaml [--set key=value ...] [--resume] [--debug]``, or
``python -m backends.torch``.

Under ``torchrun --nproc_per_node N -m backends.torch CONFIG.yaml`` every rank runs it.
Expected failures (bad config, missing file, package or GPU) print one message and exit
with status 2 (``backends.common.cli``); ``--debug`` shows their traceback. A stop signal
(SIGTERM, SIGUSR1) ends the run after its step, with a checkpoint, one line and status 75
(``backends.common.preemption``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from backends.common.cli import add_debug_argument, run_cli
from backends.common.errors import ConfigError
from backends.common.preemption import PREEMPTED_EXIT
from backends.torch.config import add_override_argument, check_device, load_config

PROG = "credit-train"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="GRPO with token-level credit assignment (native PyTorch trainer).",
    )
    parser.add_argument("config", help="YAML config file (see configs/torch/)")
    add_override_argument(parser, "credit.name=uniform")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in output_dir from its latest checkpoint",
    )
    add_debug_argument(parser)
    return parser


def _train(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    cfg = load_config(args.config, args.overrides)
    check_device(cfg.device)
    # Imported here, under run_cli: a missing package (transformers...) is a message.
    from backends.torch.trainer import train

    result = train(cfg, resume=args.resume)
    main_rank = os.environ.get("RANK", "0") == "0"
    if result.preempted is not None:
        if main_rank:
            print(f"{PROG}: {result.preempted.message()}", file=sys.stderr, flush=True)
        return PREEMPTED_EXIT
    if main_rank:
        print(f"{PROG}: {result.last_step} steps done; run folder {result.run_dir}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``credit-train``; the exit status: 0 done, 2 an expected failure (one
    message), ``PREEMPTED_EXIT`` (75) stopped by a signal after a checkpoint.

    A process of a multi-process run ends with ``os._exit`` once its output is flushed: the
    process group and the models are already released (``GRPORecipe.close``), and no C++
    destructor left for interpreter shutdown can keep the process from ending."""
    status = run_cli(PROG, _train, argv, expected=(ConfigError,))
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status


if __name__ == "__main__":
    sys.exit(main())
