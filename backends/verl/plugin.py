"""The verl plugin: registers the credit engine and trainer with verl's own registries.

verl imports it in every process that imports verl, through this project's ``verl.plugins``
entry point (pyproject.toml) or ``VERL_USE_EXTERNAL_MODULES=backends.verl.plugin`` (which
``credit-verl`` sets). It registers ``CreditFSDPEngine`` (fsdp/fsdp2 language models on
NVIDIA GPUs; verl's own engine unless a batch asks for W0) and ``CreditPPOTrainer``
(``trainer.v1.trainer_mode=credit_sync``). An unsupported verl release is refused here.
"""

from __future__ import annotations

from backends.verl.version import check_verl_version

check_verl_version()

from backends.verl.engine import register_engine  # noqa: E402
from backends.verl.trainer import register_credit_trainer  # noqa: E402

register_engine()
register_credit_trainer()
