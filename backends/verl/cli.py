"""``credit-verl`` (``python -m backends.verl``): verl's ``main_ppo`` with the credit keys.

Takes verl's own Hydra overrides unchanged, plus the credit keys under ``algorithm``::

    credit-verl algorithm.adv_estimator=grpo algorithm.credit=datc \\
        'algorithm.direction={kind:seq_classification,path:/models/rm}' \\
        data.train_files=... actor_rollout_ref.model.path=... trainer.n_gpus_per_node=1

The credit keys (``algorithm.credit``, ``algorithm.direction``,
``algorithm.credit_stats_chunk_size``; ``config.CREDIT_KEYS``) are added to verl's config
(Hydra's ``+``, which they need since verl's config does not declare them), the trainer is
``trainer.v1.trainer_mode=credit_sync`` (``CreditPPOTrainer``), and the plugin is named in
``VERL_USE_EXTERNAL_MODULES`` so that every Ray worker registers the credit engine too.

Before verl starts anything, the composed config is checked: the credit keys
(``credit_settings``: a bad value, a strategy the backend cannot serve, a verl setting the
strategy's signals do not work with) and verl's own ``validate_config``. Such an expected
failure prints one line ``credit-verl: error: ...`` naming the key and exits 2; ``--debug``
shows the traceback instead. Then verl's own ``main_ppo`` runs (its Ray cluster, rollout,
reward managers, loggers).
"""

from __future__ import annotations

import os
import sys
import warnings

from backends.common.cli import run_cli
from backends.verl.config import CREDIT_KEYS, TRAINER_MODE

PROG = "credit-verl"

#: The plugin module every verl process imports (``VERL_USE_EXTERNAL_MODULES``).
PLUGIN = "backends.verl.plugin"


def _is_credit_key(key: str) -> bool:
    return any(key == f"algorithm.{k}" or key.startswith(f"algorithm.{k}.") for k in CREDIT_KEYS)


def verl_overrides(args: list[str]) -> list[str]:
    """``args`` (Hydra overrides) with the credit keys prefixed by ``+`` (verl's config does
    not declare them); every other override unchanged."""
    out = []
    for arg in args:
        key = arg.split("=", 1)[0].lstrip("+~")
        out.append("+" + arg if _is_credit_key(key) and not arg.startswith(("+", "~")) else arg)
    return out


def checked_config(overrides: list[str]) -> object:
    """verl's ``ppo_trainer`` config composed with ``overrides``, with the credit keys and
    verl's own ``validate_config`` checked (``CreditError`` naming the key)."""
    from backends.verl.version import check_verl_version

    check_verl_version()
    # verl warns at import about each optional engine it lacks (megatron, veomni, ...)
    warnings.filterwarnings("ignore", r"\w+ engine is not available", UserWarning)
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException
    from verl.trainer import main_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from backends.verl.config import credit_settings
    from credit_core import CreditError

    config_dir = os.path.join(os.path.dirname(main_ppo.__file__), "config")
    try:
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            config = compose(config_name="ppo_trainer", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as exc:
        raise CreditError(f"verl config: {_one_line(exc)}") from exc
    credit_settings(config)
    try:
        validate_config(
            config=config,
            use_reference_policy=need_reference_policy(config),
            use_critic=need_critic(config),
        )
    except (AssertionError, ValueError, HydraException, OmegaConfBaseException) as exc:
        raise CreditError(f"verl config: {_one_line(exc)}") from exc
    return config


def _one_line(exc: BaseException) -> str:
    """``exc``'s message on one line (Hydra's and verl's span several)."""
    return " ".join(str(exc).split())


def _main(args: list[str]) -> int:
    overrides = [*verl_overrides(args), f"trainer.v1.trainer_mode={TRAINER_MODE}"]
    checked_config(overrides)
    modules = [m for m in os.environ.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m]
    os.environ["VERL_USE_EXTERNAL_MODULES"] = ",".join([*modules, PLUGIN])
    from verl.trainer import main_ppo

    sys.argv = [PROG, *overrides]
    main_ppo.main()
    return 0


def main(argv: list[str] | None = None) -> int:
    """``credit-verl``'s exit status (see the module docstring)."""
    return run_cli(PROG, _main, argv)
