"""Shared set-up of the TRL backend tests: one TRL import, one tokenizer and task per
session, a fresh tiny policy per trainer (training changes it), and ``SignalDirection``, a
direction model with attention and prefix rewards."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from tests.helpers.openrlhf_stubs import stubs_hidden

with stubs_hidden():  # the OpenRLHF tests' vllm stub must not look like vllm to TRL
    pytest.importorskip("trl.trainer.grpo_trainer")

from adapters.direction import DirectionModel, RewardOutput
from backends.trl import CreditGRPOConfig, CreditGRPOTrainer
from backends.trl.tasks import PolicyPreset, TaskData, task_data, tiny_policy

#: Settings shared by every test run: CPU, no logging to files, no checkpoints.
BASE: dict[str, Any] = {
    "use_cpu": True,
    "bf16": False,
    "report_to": [],
    "save_strategy": "no",
    "disable_tqdm": True,
    "logging_steps": 1,
    "lr_scheduler_type": "constant",
}


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    return tiny_policy(PolicyPreset())[1]


@pytest.fixture(scope="session")
def task(tokenizer: Any) -> TaskData:
    """The positional task (response positions 2, 9, 17 scored) for the tiny policy."""
    return task_data(
        "positional", {"positions": [2, 9, 17]}, len(tokenizer), tokenizer, torch.device("cpu")
    )


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make_trainer(
    task: TaskData,
    tokenizer: Any,
    tmp_path: Any,
    *,
    credit: Any = "uniform",
    stock: bool = False,
    model_seed: int = 0,
    model: Any = None,
    direction: DirectionModel | None = None,
    reward_funcs: Any = None,
    **overrides: Any,
) -> Any:
    """A ``CreditGRPOTrainer`` (or, with ``stock``, TRL's own ``GRPOTrainer`` with the same
    ``GRPOConfig`` settings) on ``task`` with a fresh tiny Llama (or ``model``: a saved
    one's path), ``direction`` (default: the task's) as its direction model, and
    ``reward_funcs`` (default: the task's reward)."""
    from trl import GRPOConfig, GRPOTrainer

    model = tiny_policy(PolicyPreset(seed=model_seed))[0] if model is None else model
    settings = {
        **BASE,
        "output_dir": str(tmp_path),
        "per_device_train_batch_size": 16,
        "num_generations": 4,
        "max_completion_length": 16,
        "learning_rate": 1e-2,
        "max_steps": 2,
        "seed": 0,
        **overrides,
    }
    common = {
        "model": model,
        "reward_funcs": task.reward if reward_funcs is None else reward_funcs,
        "train_dataset": task.train,
        "processing_class": tokenizer,
    }
    if stock:
        return GRPOTrainer(args=GRPOConfig(**settings), **common)
    return CreditGRPOTrainer(
        args=CreditGRPOConfig(credit=credit, **settings),
        direction_model=task.direction if direction is None else direction,
        **common,
    )


class SignalDirection(DirectionModel):
    """The task's direction model (``inner``: rewards and gradient) plus stand-in attention
    and prefix rewards, enough to exercise how the trainer asks for and uses them:
    attention rising 1..n over each response's valid tokens (sum 1), prefix rewards
    sin(token id + t) at valid tokens (0 at padding). ``gives_attention`` as given;
    ``calls`` records the options of every ``score`` call."""

    def __init__(self, inner: DirectionModel, *, attention: bool = True) -> None:
        self.inner = inner
        self.reward_embedding = inner.reward_embedding
        self.attention = attention
        self.calls: list[dict[str, bool]] = []

    @property
    def gives_attention(self) -> bool:
        return self.attention

    def score(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        response_ids: torch.Tensor,
        response_mask: torch.Tensor,
        *,
        with_grad: bool,
        with_attention: bool = False,
        with_prefix_rewards: bool = False,
    ) -> RewardOutput:
        asked = {"grad": with_grad, "attention": with_attention, "prefix": with_prefix_rewards}
        self.calls.append(asked)
        out = self.inner.score(
            prompt_ids, prompt_mask, response_ids, response_mask, with_grad=with_grad
        )
        mask = response_mask.bool()
        ramp = torch.cumsum(mask.float(), dim=1) * mask
        positions = torch.arange(mask.shape[1], device=mask.device)
        prefix = torch.sin(response_ids.float() + positions) * mask
        return RewardOutput(
            rewards=out.rewards,
            reward_grad=out.reward_grad,
            diagnostics=out.diagnostics,
            attention=ramp / ramp.sum(dim=1, keepdim=True).clamp_min(1.0)
            if with_attention
            else None,
            prefix_rewards=prefix if with_prefix_rewards else None,
        )
