"""Shared set-up of the TRL backend tests: one TRL import, one tokenizer and task per
session, a fresh tiny policy per trainer (training changes it)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from tests.helpers.openrlhf_stubs import stubs_hidden

with stubs_hidden():  # the OpenRLHF tests' vllm stub must not look like vllm to TRL
    pytest.importorskip("trl.trainer.grpo_trainer")

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
    **overrides: Any,
) -> Any:
    """A ``CreditGRPOTrainer`` (or, with ``stock``, TRL's own ``GRPOTrainer`` with the same
    ``GRPOConfig`` settings) on ``task`` with a fresh tiny Llama."""
    from trl import GRPOConfig, GRPOTrainer

    model = tiny_policy(PolicyPreset(seed=model_seed))[0]
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
        "reward_funcs": task.reward,
        "train_dataset": task.train,
        "processing_class": tokenizer,
    }
    if stock:
        return GRPOTrainer(args=GRPOConfig(**settings), **common)
    return CreditGRPOTrainer(
        args=CreditGRPOConfig(credit=credit, **settings), direction_model=task.direction, **common
    )
