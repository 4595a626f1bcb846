"""``credit-openrlhf``: OpenRLHF's ``train_ppo_ray`` with a token-credit strategy.

    credit-openrlhf [--credit NAME | --credit.config FILE] [--credit.<param> VALUE ...]
                    [--credit.direction.<field> VALUE ...] [--credit.placement P]
                    [--credit.stats_chunk_size N] [--debug]
                    <every train_ppo_ray flag, unchanged>

The ``--credit`` flags are taken out of the command line; every other argument is handed to
``openrlhf.cli.train_ppo_ray`` exactly as given (same tokens, same order), which runs as if
started with ``python -m openrlhf.cli.train_ppo_ray``, with the token-credit experience maker
injected into its trainer actor (``backends.openrlhf.injection``). Bad credit flags and an
unsupported OpenRLHF version stop the launcher before Ray starts, with exit status 2; so
does a missing package (flash_attn, vllm...) or file, with one message (``--debug``: the
traceback).
"""

from __future__ import annotations

import runpy
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from backends.common.cli import DEBUG_FLAG, run_cli
from backends.openrlhf.settings import OpenRLHFCreditConfig, build_config, read_config_file
from backends.openrlhf.version import SUPPORTED_TEXT, check_openrlhf_version
from credit_core import CreditError, list_strategies

PROG = "credit-openrlhf"
OPENRLHF_MODULE = "openrlhf.cli.train_ppo_ray"
BACKEND_KEYS = ("placement", "stats_chunk_size")


@dataclass
class CreditArgs:
    """The ``--credit*`` flags of one command line (values as given, strings)."""

    name: str | None = None
    config_file: str | None = None
    params: dict[str, str] = field(default_factory=dict)
    direction: dict[str, str] = field(default_factory=dict)
    backend: dict[str, str] = field(default_factory=dict)


def _credit_help() -> str:
    return f"""usage: {PROG} [credit options] <train_ppo_ray options>

Token credit assignment for OpenRLHF {SUPPORTED_TEXT}. Every option not listed here goes
to openrlhf.cli.train_ppo_ray unchanged (its options follow below).

credit options:
  --credit NAME               strategy: {", ".join(list_strategies())}
                              (default uniform = stock OpenRLHF, bit for bit)
  --credit.config FILE        YAML file with a 'credit:' key (and optional 'direction:',
                              'placement:', 'stats_chunk_size:'); flags override it
  --credit.<param> VALUE      a strategy parameter, e.g. --credit.beta 1.0 --credit.lam 0.5
                              --credit.on_nonfinite uniform --credit.seed 0
                              (entropy_top / random_top: --credit.rho 0.2 --credit.mode weight)
  --credit.direction.<field> VALUE
                              the differentiable reward model giving the direction
                              (adapters.config.RewardModelConfig), e.g.
                              --credit.direction.kind seq_classification
                              --credit.direction.path /models/rm ; default: OpenRLHF's
                              --reward.model_name_or_path as a sequence classifier
  --credit.placement P        auto | reward | policy: the actors that host the direction
                              model (auto: reward-model actors if any, else policy actors)
  --credit.stats_chunk_size N vocabulary tile of the streamed policy statistics (4096)
  {DEBUG_FLAG}                     on an expected error (bad flag, missing package or file),
                              show the traceback instead of the one-line message

Strategies other than uniform need a response-level advantage: e.g.
  --algo.advantage.estimator group_norm --algo.kl.use_loss
"""


def split_argv(argv: Sequence[str]) -> tuple[CreditArgs, list[str]]:
    """Separate the ``--credit*`` flags from the arguments meant for OpenRLHF.

    A credit flag takes one value, as ``--credit.beta 2`` or ``--credit.beta=2``. Everything
    else is returned in its original order, untouched. Raises ``CreditError`` for a credit
    flag without a value, given twice, or of an unknown form (``--credits``...).
    """
    found = CreditArgs()
    passthrough: list[str] = []
    seen: set[str] = set()
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if not token.startswith("--credit"):
            passthrough.append(token)
            continue
        flag, eq, value = token.partition("=")
        if flag != "--credit" and not flag.startswith("--credit."):
            raise CreditError(
                f"unknown flag {flag}; credit flags are --credit NAME, --credit.config FILE, "
                "--credit.<param> VALUE, --credit.direction.<field> VALUE (see --help)"
            )
        if not eq:
            if i >= len(argv) or (argv[i].startswith("--") and len(argv[i]) > 2):
                raise CreditError(f"flag {flag} expects a value")
            value = argv[i]
            i += 1
        if flag in seen:
            raise CreditError(f"flag {flag} is given twice")
        seen.add(flag)
        _store(found, flag, value)
    return found, passthrough


def _store(found: CreditArgs, flag: str, value: str) -> None:
    key = flag[len("--credit.") :]
    if flag == "--credit":
        found.name = value
    elif key == "config":
        found.config_file = value
    elif key in BACKEND_KEYS:
        found.backend[key] = value
    elif key == "direction" or key.startswith("direction."):
        sub = key[len("direction.") :]
        if not sub or "." in sub:
            raise CreditError(f"flag {flag}: expected --credit.direction.<field>")
        found.direction[sub] = value
    elif not key or "." in key:
        raise CreditError(f"flag {flag}: expected --credit.<param> with a parameter name")
    else:
        found.params[key] = value


def parse_command_line(argv: Sequence[str]) -> tuple[OpenRLHFCreditConfig, list[str]]:
    """The validated credit settings of a command line, and the arguments for OpenRLHF."""
    found, passthrough = split_argv(argv)
    file_data = read_config_file(found.config_file) if found.config_file else None
    cfg = build_config(file_data, found.name, found.params, found.direction, found.backend)
    return cfg, passthrough


def run_openrlhf(argv: Sequence[str]) -> None:
    """Run ``openrlhf.cli.train_ppo_ray`` as ``__main__`` with command line ``argv``."""
    saved = sys.argv
    sys.argv = [OPENRLHF_MODULE, *argv]
    try:
        runpy.run_module(OPENRLHF_MODULE, run_name="__main__", alter_sys=True)
    finally:
        sys.argv = saved


def train_with_credit(cfg: OpenRLHFCreditConfig, argv: Sequence[str]) -> None:
    """Run OpenRLHF's PPO/GRPO training on ``argv`` with token credit ``cfg``."""
    from backends.openrlhf.injection import driver_hooks

    with driver_hooks(cfg):
        run_openrlhf(argv)


def _print_help() -> None:
    print(_credit_help())
    print(f"train_ppo_ray options ({OPENRLHF_MODULE}):")
    sys.stdout.flush()
    try:
        run_openrlhf(["--help"])
    except SystemExit:
        pass
    except ImportError as exc:
        print(f"  (OpenRLHF's options cannot be listed here: {exc})")


def _launch(args: list[str], train: Callable[[OpenRLHFCreditConfig, Sequence[str]], None]) -> int:
    cfg, passthrough = parse_command_line(args)
    if "-h" in passthrough or "--help" in passthrough:
        _print_help()
        return 0
    version = check_openrlhf_version()
    params = ", ".join(f"{k}={v}" for k, v in cfg.credit.params.items())
    print(f"{PROG}: OpenRLHF {version}, credit strategy {cfg.credit.name}({params})")
    train(cfg, passthrough)
    return 0


def main(
    argv: Sequence[str] | None = None,
    *,
    train: Callable[[OpenRLHFCreditConfig, Sequence[str]], None] = train_with_credit,
) -> int:
    """Entry point of ``credit-openrlhf`` / ``python -m backends.openrlhf``; exit status.

    ``train`` runs the training (replaced in tests). Returns 0 on success, 2 on an expected
    failure: a credit or version error (nothing started), a missing package such as
    flash_attn or a missing file (one message on stderr; ``--debug`` shows the traceback,
    ``backends.common.cli``).
    """
    return run_cli(PROG, lambda args: _launch(args, train), argv)
