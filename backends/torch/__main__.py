"""``credit-train CONFIG.yaml [--set key=value ...] [--resume]``, or ``python -m backends.torch``.

Under ``torchrun --nproc_per_node N -m backends.torch CONFIG.yaml`` every rank runs it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from backends.torch.config import ConfigError, add_override_argument, load_config
from backends.torch.trainer import train


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="credit-train",
        description="GRPO with token-level credit assignment (native PyTorch trainer).",
    )
    parser.add_argument("config", help="YAML config file (see configs/torch/)")
    add_override_argument(parser, "credit.name=uniform")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in output_dir from its latest checkpoint",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result = train(load_config(args.config, args.overrides), resume=args.resume)
    except ConfigError as exc:
        print(f"credit-train: {exc}", file=sys.stderr)
        return 2
    print(f"credit-train: {result.last_step} steps done; run folder {result.run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
