"""Native PyTorch GRPO/PPO trainer that takes any ``credit_core`` strategy.

Modules (torchtune style, one job each): ``config`` (pydantic + YAML + ``--set``),
``models`` (policy, reference, GGUF files), ``rollout`` / ``rollout_vllm`` (sampling),
``rollout_rewards`` (rewards and reward gradients of a rollout batch), ``answer_span``,
``loss``, ``kl``, ``gae`` and ``critic`` (PPO with a critic), ``implicit_prm`` (PRIME's
second model), ``compare`` and ``credit_samples`` (other strategies on the run's batches),
``schedule``, ``checkpoint``, ``run_lock``, ``metrics``, ``distributed``, ``step`` (what the
phases of a step hand to each other) and the recipe in ``trainer``. Prompts and built-in
tasks come from ``backends.common``.

Public entry points (imported lazily, so ``backends.torch.config`` stays light)::

    from backends.torch import train, RunResult, TrainConfig, load_config, config_from_dict
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "train": "backends.torch.trainer",
    "RunResult": "backends.torch.trainer",
    "GRPORecipe": "backends.torch.trainer",
    "TrainConfig": "backends.torch.config",
    "ConfigError": "backends.common.errors",
    "load_config": "backends.torch.config",
    "config_from_dict": "backends.torch.config",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'backends.torch' has no attribute {name!r}")
