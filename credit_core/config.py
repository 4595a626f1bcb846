"""``CreditConfig``: which strategy, with which parameters, as it appears in configs."""

from __future__ import annotations

from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    ValidationError,
    model_validator,
)

from credit_core.agreement_gate import GateConfig
from credit_core.errors import CreditError, validation_messages


class CreditConfig(BaseModel):
    """A strategy name plus its parameters, validated against the registry.

    Accepts ``"datc"`` (so a YAML line ``credit: datc`` works) or a mapping
    ``{"name": "datc", "beta": 2.0, "lam": 0.5}``. Parameters other than ``name`` and
    ``gate`` are validated against the strategy's ``Params``; an unknown strategy, an
    unknown key or an out-of-range value raises ``CreditError`` naming it, from the
    constructor and from ``parse``. Inside another pydantic model the same error surfaces as
    that model's ``ValidationError`` on the ``credit`` field.

    ``gate`` (``GateConfig``, off when absent and then left out of ``model_dump``): the
    agreement gate toward GRPO (docs/design.md, "Trusting the direction model"), taken by a
    strategy whose signals come from a direction model, in a mean-preserving weight form.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str = "uniform"
    gate: GateConfig | None = Field(None, exclude_if=lambda gate: gate is None)

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise _credit_error(exc) from None

    @model_validator(mode="wrap")
    @classmethod
    def _validated(cls, data: Any, handler: ModelWrapValidatorHandler[CreditConfig]) -> Any:
        """A ``CreditConfig`` instance as it is (validated when it was made: a config
        holding one does not validate it again); a name as ``{"name": ...}``; the strategy
        and its parameters checked against the registry once."""
        if isinstance(data, CreditConfig):
            return data
        if isinstance(data, str):
            data = {"name": data}
        from credit_core.registry import validate_params

        model = handler(data)
        params = validate_params(model.name, model.params)
        if model.gate is not None:
            _check_gate(model.name, params)
        return model

    @property
    def params(self) -> dict[str, Any]:
        """The strategy parameters (every key but ``name``), as given."""
        return dict(self.model_extra or {})

    @property
    def label(self) -> str:
        """The strategy's name, with its parameters and gate when given (``datc(beta=2.0)``)."""
        params = self.params
        if self.gate is not None:
            params["gate"] = self.gate.model_dump(mode="json")
        if not params:
            return self.name
        return f"{self.name}({', '.join(f'{k}={v}' for k, v in sorted(params.items()))})"

    @classmethod
    def parse(cls, value: str | dict[str, Any] | CreditConfig) -> CreditConfig:
        """Validate ``value``; on failure raise ``CreditError`` (not pydantic's error)."""
        if isinstance(value, CreditConfig):
            return value
        data = {"name": value} if isinstance(value, str) else value
        if isinstance(data, dict) and all(isinstance(key, str) for key in data):
            return cls(**data)  # model_validate would check the registry twice (custom init)
        try:
            return cls.model_validate(value)
        except ValidationError as exc:
            raise _credit_error(exc) from None


def _check_gate(name: str, params: BaseModel) -> None:
    """``CreditError`` naming ``gate`` where strategy ``name`` (with its validated ``params``)
    cannot take it: it reads no direction model, or its paper form gives token rewards."""
    from credit_core.batch import SOURCES
    from credit_core.registry import strategy_class

    cls = strategy_class(name)
    reads = cls.requires | (cls.work_requires or frozenset())  # plan.signals_read
    if not any(SOURCES[s] == "direction" for s in reads):
        scored = sorted(s for s, source in SOURCES.items() if source == "direction")
        raise CreditError(
            f"credit.gate: strategy {name!r} reads no direction model (it reads "
            f"{sorted(reads) or 'no signal'}; a gated strategy reads one of {scored}): the "
            "gate weighs a direction model's credit by its agreement with the reward"
        )
    if getattr(params, "mode", None) == "paper":
        raise CreditError(
            f"credit.gate: strategy {name!r} with mode 'paper' gives token rewards, not "
            "mean-preserving weights; the gate's mix w' = 1 + alpha (w - 1) is defined on "
            "weights that keep each response's mean advantage: use mode 'mean'"
        )


def _credit_error(exc: ValidationError) -> CreditError:
    """One ``CreditError`` for a failed ``CreditConfig`` validation. The registry's own
    errors (unknown strategy, bad parameter) keep their message, which names the field."""
    problems = validation_messages(exc, CreditConfig)
    text = "; ".join(str(p) for p in problems)
    if all(p.kind == "raised" for p in problems):
        return CreditError(text)
    return CreditError(f"credit config: {text}")
