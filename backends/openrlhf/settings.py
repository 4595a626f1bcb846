"""The token-credit settings of an OpenRLHF run: strategy, direction model, placement.

One pydantic model, ``OpenRLHFCreditConfig``, filled from an optional YAML file and the
launcher's ``--credit*`` flags (flags win). File layout (every key but ``credit`` optional)::

    credit: datc                  # or {name: datc, beta: 1.0, lam: 0.5}: credit_core.CreditConfig
    direction:                    # the differentiable RM: adapters.config.RewardModelConfig
      kind: seq_classification
      path: /models/rm
    placement: auto               # where the direction model runs: auto | reward | policy
    stats_chunk_size: 4096        # vocabulary chunk of the streamed policy statistics

Unknown keys are rejected with their name; so are bad strategy parameters (by credit_core).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from backends.common.config_values import parse_credit, parse_direction
from credit_core import CreditConfig, CreditError
from credit_core.errors import validation_messages
from credit_core.policy_stats import DEFAULT_CHUNK_SIZE

Placement = Literal["auto", "reward", "policy"]


class OpenRLHFCreditConfig(BaseModel):
    """Token-credit settings of an OpenRLHF run (see the module docstring for the YAML form).

    - ``credit``: the strategy and its parameters (``uniform`` = stock OpenRLHF).
    - ``direction``: the differentiable reward model that gives DATC its direction (and
      ``abc`` / ``red`` its attention / prefix rewards), as the fields of
      ``adapters.config.RewardModelConfig``; None means: OpenRLHF's own reward model
      (``--reward.model_name_or_path``) loaded as a sequence classifier.
    - ``placement``: the Ray actors that host the direction model. ``reward``: OpenRLHF's
      reward-model actors; ``policy``: the policy actors (needed with ``--reward.remote_url``,
      which has no reward-model actors); ``auto``: ``reward`` if those actors exist, else
      ``policy``.
    - ``stats_chunk_size``: vocabulary entries per tile of the streamed policy statistics.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    credit: CreditConfig = Field(default_factory=CreditConfig)
    direction: dict[str, Any] | None = None
    placement: Placement = "auto"
    stats_chunk_size: int = Field(DEFAULT_CHUNK_SIZE, ge=1)

    @field_validator("direction")
    @classmethod
    def _direction_is_a_reward_model(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        found = parse_direction(value, "direction")
        return None if found is None else found.model_dump(exclude_unset=True)


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The mapping in YAML file ``path``; it must contain a ``credit`` key."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise CreditError(f"--credit.config: no file at {str(file)!r}")
    try:
        data = yaml.safe_load(file.read_text())
    except yaml.YAMLError as exc:
        raise CreditError(f"--credit.config {file}: not valid YAML ({exc})") from exc
    if not isinstance(data, dict) or "credit" not in data:
        raise CreditError(
            f"--credit.config {file}: expected a YAML mapping with a 'credit' key "
            "(e.g. 'credit: datc'), got "
            + (f"keys {sorted(data)}" if isinstance(data, dict) else type(data).__name__)
        )
    return data


def build_config(
    file_data: Mapping[str, Any] | None,
    name: str | None,
    params: Mapping[str, str],
    direction: Mapping[str, str],
    backend: Mapping[str, str],
) -> OpenRLHFCreditConfig:
    """Merge a config file's mapping with command-line values and validate the result.

    ``name`` is ``--credit NAME``; ``params`` the ``--credit.<param>`` values (read as YAML
    scalars, so ``2`` is an int and ``0.5`` a float, as in a config file); ``direction``
    the ``--credit.direction.<field>`` values; ``backend`` ``placement``/``stats_chunk_size``.
    A flag overrides the file. When ``--credit NAME`` selects another strategy than the file,
    the file's strategy parameters are not carried over (a note says so on stderr).
    Raises ``CreditError`` naming every bad key.
    """
    data: dict[str, Any] = dict(file_data or {})
    # each credit value is validated once (``parse_credit``): the file's, and the one the
    # flags make of it; the model keeps the validated instance
    credit = parse_credit(data["credit"], "credit") if "credit" in data else None
    given: dict[str, Any] = {"name": "uniform"}
    if credit is not None:
        given = {"name": credit.name, **credit.params}
    if name is not None and name != given["name"]:
        if credit is not None and credit.params:
            print(
                f"credit: --credit {name} replaces the file's strategy {credit.name!r}; "
                f"its parameters {credit.params} are not used",
                file=sys.stderr,
            )
        credit, given = None, {"name": name}
    if params or credit is None:
        flags = {key: flag_value(text) for key, text in params.items()}
        credit = parse_credit({**given, **flags}, "credit")
    data["credit"] = credit
    if direction:
        data["direction"] = {**(data.get("direction") or {}), **direction}
    data.update(backend)
    try:
        return OpenRLHFCreditConfig.model_validate(data)
    except ValidationError as exc:
        raise CreditError(_format_errors(exc)) from exc


def flag_value(text: str) -> Any:
    """A command-line value as a YAML file would hold it: ``2`` -> 2, ``0.5`` -> 0.5,
    ``true`` -> True, ``uniform`` -> "uniform"; ``1e-3`` (a string to YAML 1.1) -> 0.001."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _format_errors(exc: ValidationError) -> str:
    lines = []
    for problem in validation_messages(exc, OpenRLHFCreditConfig):
        if problem.kind == "unknown":
            lines.append(f"unknown key {problem.field!r}; allowed keys: {list(problem.allowed)}")
        else:
            lines.append(str(problem))
    return "invalid token-credit settings:\n  " + "\n  ".join(lines)
