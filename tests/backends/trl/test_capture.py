"""Reading the policy inside TRL's forward: PEFT-wrapped models and ZeRO-3 partitions."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from backends.trl.capture import HiddenCapture, causal_lm_of, lm_head
from backends.trl.tasks import PolicyPreset, TaskData, tiny_policy
from credit_core import CreditError


def test_lora_model_reads_base_head_and_backbone(
    task: TaskData, tokenizer: Any, tmp_path: Any
) -> None:
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    from backends.trl import CreditGRPOConfig, CreditGRPOTrainer
    from tests.backends.trl.conftest import BASE

    args = CreditGRPOConfig(
        output_dir=str(tmp_path),
        credit="datc",
        num_generations=4,
        max_steps=1,
        per_device_train_batch_size=8,
        max_completion_length=12,
        **BASE,
    )
    trainer = CreditGRPOTrainer(
        model=tiny_policy(PolicyPreset())[0],
        reward_funcs=task.reward,
        args=args,
        train_dataset=task.train,
        processing_class=tokenizer,
        peft_config=config,
        direction_model=task.direction,
    )
    base = trainer.model.get_base_model()
    assert causal_lm_of(trainer.model) is base
    with lm_head(trainer.model) as (weight, _):
        assert weight is base.get_output_embeddings().weight
    trainer.train()
    logged = trainer.state.log_history[0]
    assert logged["credit/weight_max"] > 1.0


def test_lora_on_the_lm_head_is_refused() -> None:
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(
        tiny_policy(PolicyPreset())[0], peft.LoraConfig(r=2, target_modules=["lm_head"])
    )
    with pytest.raises(CreditError, match="LM head carries a PEFT adapter"), lm_head(model):
        pass


def test_hidden_capture_records_only_when_asked() -> None:
    model = tiny_policy(PolicyPreset())[0]
    cap = HiddenCapture(model)
    ids = torch.tensor([[5, 6, 7]])
    model(input_ids=ids)
    with cap.recording() as chunks:
        model(input_ids=ids)
        model(input_ids=ids[:, :2])
    model(input_ids=ids)
    assert [tuple(c.shape) for c in chunks] == [(1, 3, 64), (1, 2, 64)]
    cap.remove()
