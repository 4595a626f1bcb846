"""The credit section of every backend's config, typed (``CreditSection``: the strategy,
the direction model, the vocabulary tile size), and the one parser of its keys as a
framework's own config gives them (a YAML value, a command-line string, an OmegaConf node
turned plain), with one error contract: a ``CreditError`` whose message starts with the key
it names.

Each backend maps its framework's config idiom onto the section (``SectionKeys``: the keys
as the user writes them): the native trainer's YAML ``credit`` / ``reward.direction_model``,
TRL's fields ``credit`` / ``direction`` / ``credit_stats_chunk_size``, verl's Hydra keys
``algorithm.credit`` / ``algorithm.direction`` / ``algorithm.credit_stats_chunk_size``,
OpenRLHF's ``credit`` / ``direction`` / ``stats_chunk_size`` (flags ``--credit``,
``--credit.direction.*``, ``--credit.stats_chunk_size``). The tile size is one field,
``CreditSection.chunk_size``; its key is the credit prefix plus ``stats_chunk_size`` in
every backend.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from adapters.config import RewardModelConfig
from credit_core import CreditConfig, CreditError
from credit_core.errors import validation_messages
from credit_core.policy_stats import DEFAULT_CHUNK_SIZE


@dataclass(frozen=True)
class SectionKeys:
    """The credit section's keys as the user writes them in one backend's config."""

    credit: str = "credit"
    direction: str = "direction"
    chunk_size: str = "credit_stats_chunk_size"


@dataclass(frozen=True)
class CreditSection:
    """The credit section, validated: ``credit`` the strategy and its parameters,
    ``direction`` the frozen differentiable reward model (None: the backend's default, or
    no strategy signal needs one), ``chunk_size`` (>= 1) the vocabulary entries per tile of
    the streamed policy statistics / W0."""

    credit: CreditConfig
    direction: RewardModelConfig | None = None
    chunk_size: int = DEFAULT_CHUNK_SIZE


def parse_section(
    credit: Any,
    direction: Any,
    chunk_size: Any,
    keys: SectionKeys = SectionKeys(),
    *,
    gate: bool = False,
) -> CreditSection:
    """The ``CreditSection`` of the three values as a config gives them (``chunk_size``
    None: the default); ``CreditError`` starting with the key (``keys``) of a bad one.
    ``gate``: whether the backend applies ``credit.gate`` (``parse_credit``)."""
    return CreditSection(
        parse_credit(credit, keys.credit, gate=gate),
        parse_direction(direction, keys.direction),
        parse_chunk_size(chunk_size, keys.chunk_size),
    )


def parse_chunk_size(value: Any, key: str) -> int:
    """``key``: an integer >= 1 (None: ``DEFAULT_CHUNK_SIZE``)."""
    if value is None:
        return DEFAULT_CHUNK_SIZE
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CreditError(f"{key}: expected an integer >= 1, got {value!r}")
    return value


def json_object(key: str, value: Any) -> Any:
    """``value``, with a JSON-object string (a command-line value) decoded."""
    if isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise CreditError(f"{key}: expected a JSON object, got {value!r} ({exc})") from exc
    return value


def parse_credit(value: Any, key: str, *, gate: bool = False) -> CreditConfig:
    """``key``: a strategy name or ``{name: ..., <params>}`` (None: ``uniform``). ``gate``:
    whether the backend applies ``credit.gate`` (``backends.common.credit.CreditRun``); a
    backend that does not refuses the key rather than drop it."""
    value = json_object(key, "uniform" if value is None else value)
    if not isinstance(value, (str, dict, CreditConfig)):
        raise CreditError(
            f"{key}: expected a strategy name or a mapping with 'name', got {type(value).__name__}"
        )
    try:
        credit = CreditConfig.parse(value)
    except CreditError as exc:
        raise CreditError(f"{key}: {exc}") from exc
    if credit.gate is not None and not gate:
        raise CreditError(
            f"{key}.gate: this backend does not apply the agreement gate yet (the native "
            "trainer does: python -m backends.torch); drop the gate"
        )
    return credit


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
