"""``get_strategy``: from a name or a ``CreditConfig`` to a ready strategy instance."""

from __future__ import annotations

from typing import Any

from credit_core.config import CreditConfig
from credit_core.errors import CreditError
from credit_core.registry import strategy_class, validate_params
from credit_core.strategy import CreditStrategy


def get_strategy(spec: str | CreditConfig | dict[str, Any], **params: Any) -> CreditStrategy:
    """A strategy instance with validated parameters.

    ``get_strategy("datc", beta=2.0)``, ``get_strategy(CreditConfig(...))`` and
    ``get_strategy({"name": "datc", "beta": 2.0})`` are equivalent. Raises ``CreditError``
    for an unknown name (listing the registered ones) or a bad parameter (naming it).
    """
    if isinstance(spec, CreditConfig):
        name, merged = spec.name, {**spec.params, **params}
    elif isinstance(spec, dict):
        cfg = CreditConfig.parse(spec)
        name, merged = cfg.name, {**cfg.params, **params}
    elif isinstance(spec, str):
        name, merged = spec, params
    else:
        raise CreditError(
            f"get_strategy: expected a name, a dict or a CreditConfig, got {type(spec).__name__}"
        )
    cls = strategy_class(name)
    return cls(validate_params(name, merged))
