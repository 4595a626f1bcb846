"""``CreditConfig``: which strategy, with which parameters, as it appears in configs."""

from __future__ import annotations

from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    ModelWrapValidatorHandler,
    ValidationError,
    model_validator,
)

from credit_core.errors import CreditError, validation_messages


class CreditConfig(BaseModel):
    """A strategy name plus its parameters, validated against the registry.

    Accepts ``"datc"`` (so a YAML line ``credit: datc`` works) or a mapping
    ``{"name": "datc", "beta": 2.0, "lam": 0.5}``. Parameters other than ``name`` are
    validated against the strategy's ``Params``; an unknown strategy, an unknown key or an
    out-of-range value raises ``CreditError`` naming it, from the constructor and from
    ``parse``. Inside another pydantic model the same error surfaces as that model's
    ``ValidationError`` on the ``credit`` field.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str = "uniform"

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
        validate_params(model.name, model.params)
        return model

    @property
    def params(self) -> dict[str, Any]:
        """The strategy parameters (every key but ``name``), as given."""
        return dict(self.model_extra or {})

    @property
    def label(self) -> str:
        """The strategy's name, with its parameters when given (``datc(beta=2.0)``)."""
        params = self.params
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


def _credit_error(exc: ValidationError) -> CreditError:
    """One ``CreditError`` for a failed ``CreditConfig`` validation. The registry's own
    errors (unknown strategy, bad parameter) keep their message, which names the field."""
    problems = validation_messages(exc, CreditConfig)
    text = "; ".join(str(p) for p in problems)
    if all(p.kind == "raised" for p in problems):
        return CreditError(text)
    return CreditError(f"credit config: {text}")
