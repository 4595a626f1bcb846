"""``CreditConfig``: which strategy, with which parameters, as it appears in configs."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from credit_core.errors import CreditError


class CreditConfig(BaseModel):
    """A strategy name plus its parameters, validated against the registry.

    Accepts ``"datc"`` (so a YAML line ``credit: datc`` works) or a mapping
    ``{"name": "datc", "beta": 2.0, "lam": 0.5}``. Parameters other than ``name`` are
    validated against the strategy's ``Params``; an unknown strategy, an unknown key or an
    out-of-range value fails validation with a message naming it.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str = "uniform"

    @model_validator(mode="before")
    @classmethod
    def _short_form(cls, data: Any) -> Any:
        if isinstance(data, str):
            return {"name": data}
        if isinstance(data, CreditConfig):
            return data.model_dump()
        return data

    @model_validator(mode="after")
    def _validate_against_registry(self) -> CreditConfig:
        from credit_core.registry import validate_params

        validate_params(self.name, self.params)
        return self

    @property
    def params(self) -> dict[str, Any]:
        """The strategy parameters (every key but ``name``), as given."""
        return dict(self.model_extra or {})

    @classmethod
    def parse(cls, value: str | dict[str, Any] | CreditConfig) -> CreditConfig:
        """Validate ``value``; on failure raise ``CreditError`` (not pydantic's error)."""
        if isinstance(value, CreditConfig):
            return value
        try:
            return cls.model_validate(value)
        except ValueError as exc:
            cause = _credit_cause(exc)
            raise (cause or CreditError(f"credit config: {exc}")) from exc


def _credit_cause(exc: ValueError) -> CreditError | None:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        for err in errors():
            inner = err.get("ctx", {}).get("error")
            if isinstance(inner, CreditError):
                return inner
    return None
