"""Training backends: ``backends.torch`` (native PyTorch GRPO) and ``backends.openrlhf``."""

from credit_core.layout import check_layout

check_layout()
