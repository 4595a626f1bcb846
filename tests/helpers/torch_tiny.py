"""Shared tiny run configs for the torch-backend tests (not a test module)."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest

TIME_PREFIXES = ("time/", "throughput/")

#: ``tiny_config`` updates of a run whose resume is checked bit for bit: a strategy with RNG
#: state, a KL term, a schedule, evaluations at steps 0, 2 and 3 (add a checkpoint section).
RESUMABLE: dict[str, Any] = {
    "steps": 3,
    "credit": {"name": "datc_shuffled", "seed": 3},
    "algorithm": {"kl_coef": 0.05},
    "optim": {"lr": 3e-3, "schedule": "linear", "warmup_steps": 1},
    "eval": {"interval": 2},
}


def tiny_config(output_dir: Path, **updates: Any) -> dict[str, Any]:
    """The smallest useful run: tiny Llama, positional task, 2 prompts x G=4, 6 new tokens.

    ``updates`` replace top-level keys; a dict value is merged into that section.
    """
    cfg: dict[str, Any] = {
        "seed": 0,
        "steps": 3,
        "output_dir": str(output_dir),
        "credit": "uniform",
        "policy": {"preset": {"family": "llama", "size": "tiny"}},
        "data": {"task": "positional", "task_params": {"num_prompts": 16, "num_eval_prompts": 4}},
        "rollout": {"group_size": 4, "prompts_per_step": 2, "max_new_tokens": 6},
        "algorithm": {"micro_batch_size": 8},
        "optim": {"lr": 3e-3},
        "eval": {"interval": 0},
        "checkpoint": {"interval": 0},
        "logging": {"progress": False, "tensorboard": False},
    }
    for key, value in updates.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **copy.deepcopy(value)}
        else:
            cfg[key] = copy.deepcopy(value)
    return cfg


def comparable(record: dict[str, float]) -> dict[str, float]:
    """A metrics record without wall-clock figures (NaN-safe for exact comparison)."""
    return {
        k: ("nan" if isinstance(v, float) and math.isnan(v) else v)  # type: ignore[misc]
        for k, v in record.items()
        if not k.startswith(TIME_PREFIXES)
    }


def build_policy_with_frequent_eos(*args: Any, **kwargs: Any) -> Any:
    """``backends.torch.models.build_policy``, then 300 more token ids count as EOS: a tiny
    random policy then ends ~60% of responses per token, and the longest response of a
    generate call (its number of decoding steps) differs between ranks."""
    from backends.torch.models import build_policy

    policy = build_policy(*args, **kwargs)
    policy.eos_ids = [*policy.eos_ids, *range(2, 302)]
    return policy


def crash_in_step_3(cfg: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Train ``cfg`` until step 3 raises (steps 1-2 done and checkpointed as ``cfg`` says),
    then put the real ``GRPORecipe.train_step`` back, ready for a ``resume=True`` run."""
    from backends.torch.trainer import GRPORecipe, train

    real_step = GRPORecipe.train_step

    def crashing(self: GRPORecipe) -> dict[str, float]:
        if self.step == 2:
            raise RuntimeError("simulated crash")
        return real_step(self)

    monkeypatch.setattr(GRPORecipe, "train_step", crashing)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(cfg)
    monkeypatch.setattr(GRPORecipe, "train_step", real_step)
