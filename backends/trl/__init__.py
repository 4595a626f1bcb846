"""TRL backend: ``trl.GRPOTrainer`` with ``credit_core`` token advantages (docs/trl.md).

A TRL user changes one import and adds ``credit: datc`` (plus ``direction:``) to the YAML::

    from backends.trl import CreditGRPOConfig as GRPOConfig, CreditGRPOTrainer as GRPOTrainer

Modules: ``version`` (the supported TRL release, checked without importing TRL), ``config``
(``CreditGRPOConfig``), ``capture`` (hidden states and LM head inside TRL's forward),
``trainer`` (``CreditGRPOTrainer``), ``rewards`` (a direction model as a TRL reward
function), ``tasks`` (built-in offline tasks as TRL datasets), ``cli`` (``credit-trl``).
Importing this package refuses an unsupported TRL version.
"""

from backends.trl.version import check_trl_version

check_trl_version()

from backends.trl.config import CreditGRPOConfig  # noqa: E402
from backends.trl.trainer import CreditGRPOTrainer  # noqa: E402

__all__ = ["CreditGRPOConfig", "CreditGRPOTrainer", "check_trl_version"]
