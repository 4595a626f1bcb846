"""The credit keys as a framework's own config gives them (a YAML value, a command-line
string, an OmegaConf node turned plain), parsed into the project's models with one error
contract: a ``CreditError`` whose message starts with the key it names.

Shared by the backends whose frameworks own the config file (TRL's ``GRPOConfig``, verl's
Hydra config); ``key`` is the key as the user writes it there (``credit``,
``algorithm.credit``).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from adapters.config import RewardModelConfig
from credit_core import CreditConfig, CreditError, strategy_class
from credit_core.batch import TRAINED_MODEL_SIGNALS
from credit_core.errors import validation_messages


def json_object(key: str, value: Any) -> Any:
    """``value``, with a JSON-object string (a command-line value) decoded."""
    if isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise CreditError(f"{key}: expected a JSON object, got {value!r} ({exc})") from exc
    return value


def parse_credit(value: Any, key: str) -> CreditConfig:
    """``key``: a strategy name or ``{name: ..., <params>}`` (None: ``uniform``)."""
    value = json_object(key, "uniform" if value is None else value)
    if not isinstance(value, (str, dict, CreditConfig)):
        raise CreditError(
            f"{key}: expected a strategy name or a mapping with 'name', got {type(value).__name__}"
        )
    try:
        return CreditConfig.parse(value)
    except CreditError as exc:
        raise CreditError(f"{key}: {exc}") from exc


def parse_direction(value: Any, key: str) -> RewardModelConfig | None:
    """``key``: a ``RewardModelConfig`` mapping (docs/reward_models.md) or None; every
    problem named by its dotted key under ``key``."""
    value = json_object(key, value)
    if value is None or isinstance(value, RewardModelConfig):
        return value
    if not isinstance(value, dict):
        raise CreditError(
            f"{key}: expected a mapping with 'kind' (docs/reward_models.md), got {value!r}"
        )
    try:
        return RewardModelConfig.model_validate(value)
    except ValidationError as exc:
        problems = validation_messages(exc, RewardModelConfig)
        lines = [
            f"{key}.{p.field}: {p.message}" if p.field else f"{key}: {p.message}" for p in problems
        ]
        raise CreditError("; ".join(lines)) from None


def trained_model_refusal(name: str, backend: str) -> str | None:
    """Why ``backend`` (a plugin backend: TRL, OpenRLHF, verl) cannot serve strategy ``name``
    because it reads a second trainable model (``TRAINED_MODEL_SIGNALS``: PRIME's implicit
    PRM), or None when the strategy reads none."""
    hosted = sorted(strategy_class(name).requires & TRAINED_MODEL_SIGNALS)
    if not hosted:
        return None
    return (
        f"it reads {hosted}, the log-probs of a second trainable model (PRIME's implicit PRM "
        "pi_phi, built from the reference policy, updated every step on the outcome labels "
        f"and checkpointed with the policy); the {backend} backend cannot host a second "
        "trainable model inside the plugin contract (docs/backends.md, 'Strategies with a "
        "trainable model'); run it with the native trainer (python -m backends.torch)"
    )
