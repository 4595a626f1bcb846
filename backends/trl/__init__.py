"""TRL backend: ``trl.GRPOTrainer`` with ``credit_core`` token advantages (docs/trl.md).

A TRL user changes one import and adds ``credit: datc`` (plus ``direction:``) to the YAML::

    from backends.trl import CreditGRPOConfig as GRPOConfig, CreditGRPOTrainer as GRPOTrainer

Modules: ``version`` (the supported TRL release, checked without importing TRL), ``config``
(``CreditGRPOConfig``), ``capture`` (hidden states and LM head inside TRL's forward),
``trainer`` (``CreditGRPOTrainer``), ``rewards`` (a direction model as a TRL reward
function), ``tasks`` (built-in offline runs), ``cli`` (``credit-trl``). The exports are
imported lazily (so ``backends.trl.cli`` can report a missing or unsupported TRL as one
message); importing ``backends.trl.config`` refuses an unsupported TRL version.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "CreditGRPOConfig": "backends.trl.config",
    "CreditGRPOTrainer": "backends.trl.trainer",
    "check_trl_version": "backends.trl.version",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'backends.trl' has no attribute {name!r}")
