"""Built-in offline runs for TRL: a tiny policy built from a config, and a built-in task
(``backends.common.tasks``, e.g. ``positional``) as TRL datasets plus its reward.

Nothing downloads: the policy is ``adapters.tiny.tiny_causal_lm`` with the in-process BPE
tokenizer, the task's prompts become ``datasets.Dataset`` rows ``{"prompt": text}``, and its
frozen differentiable reward model is both the reward function (``DirectionReward``) and the
direction model of the credit strategy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from adapters.direction import DirectionModel
from adapters.tiny import tiny_causal_lm, train_bpe_tokenizer
from backends.common.errors import ConfigError
from backends.common.response_mask import response_mask_from_eos
from backends.common.tasks import get_task
from backends.trl.rewards import DirectionReward
from credit_core import CreditError


class PolicyPreset(BaseModel):
    """``policy_preset``: a tiny random policy (``adapters.tiny``), built from a config."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    family: Literal["llama", "qwen2", "gpt2"] = "llama"
    size: Literal["tiny", "small"] = "tiny"
    vocab_size: int = Field(default=512, ge=300, description="in-process byte-level BPE size")
    seed: int = Field(default=0, description="weight-init seed")


def parse_preset(value: Any) -> PolicyPreset:
    """``policy_preset`` as a ``PolicyPreset``; ``CreditError`` naming the key."""
    try:
        return PolicyPreset.model_validate(value)
    except ValidationError as exc:
        lines = [f"policy_preset.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
        raise CreditError("; ".join(lines)) from None


def tiny_policy(preset: PolicyPreset) -> tuple[Any, Any]:
    """(model, tokenizer): a random ``preset.family`` causal LM (float32) and its BPE."""
    tokenizer = train_bpe_tokenizer(vocab_size=preset.vocab_size)
    model = tiny_causal_lm(
        preset.family,
        len(tokenizer),
        size=preset.size,
        seed=preset.seed,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return model, tokenizer


@dataclass(frozen=True)
class TaskData:
    """A built-in task for TRL: ``train``/``held_out`` datasets (column ``prompt``), the
    direction model and the same model as a TRL reward function."""

    name: str
    train: Any
    held_out: Any
    direction: DirectionModel
    reward: DirectionReward


def task_data(
    name: str, params: dict[str, Any], vocab_size: int, tokenizer: Any, device: torch.device
) -> TaskData:
    """Task ``name`` with ``params`` (``task_params``) for a policy of ``vocab_size``
    outputs; ``CreditError`` naming the key for a bad name or parameter."""
    from datasets import Dataset

    try:
        task = get_task(name, params, vocab_size)
    except ConfigError as exc:  # name the keys as this backend's YAML spells them
        message = str(exc).replace("data.task_params.", "task_params.")
        raise CreditError(message.replace("data.task:", "task:")) from None
    direction = task.build_direction(device)
    return TaskData(
        name=name,
        train=Dataset.from_dict({"prompt": [p.text for p in task.train_prompts]}),
        held_out=Dataset.from_dict({"prompt": [p.text for p in task.eval_prompts]}),
        direction=direction,
        reward=DirectionReward(direction, tokenizer, name=name),
    )


@torch.no_grad()
def held_out_reward(
    model: Any,
    tokenizer: Any,
    direction: DirectionModel,
    prompts: list[str],
    *,
    samples_per_prompt: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    seed: int = 0,
) -> float:
    """Mean direction-model reward of ``samples_per_prompt`` sampled completions per prompt
    (full distribution: top_k 0, top_p 1), each up to and including its first EOS."""
    from transformers import GenerationConfig

    device = next(model.parameters()).device
    enc = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left").to(device)
    ids = enc["input_ids"].repeat_interleave(samples_per_prompt, dim=0)
    mask = enc["attention_mask"].repeat_interleave(samples_per_prompt, dim=0)
    config = GenerationConfig(  # type: ignore[no-untyped-call]
        do_sample=True,
        temperature=temperature,
        top_k=0,
        top_p=1.0,
        max_new_tokens=max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    was_training = model.training
    model.eval()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    model.train(was_training)
    response = out[:, ids.shape[1] :]
    response_mask = response_mask_from_eos(response, [int(tokenizer.eos_token_id)])
    rewards = direction.score(ids, mask, response, response_mask, with_grad=False).rewards
    return float(rewards.float().mean())
