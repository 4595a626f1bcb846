"""Training backends that serve ``credit_core``'s strategies: ``backends.torch`` (the native
PyTorch GRPO/PPO trainer), ``backends.trl`` (TRL's ``GRPOTrainer``), ``backends.openrlhf``
(OpenRLHF's Ray pipeline) and ``backends.verl`` (verl's ``main_ppo``, in ``.venv-verl``),
on the shared layer ``backends.common`` and the credit samples of ``backends.samples``."""

from credit_core.layout import check_layout

check_layout()
