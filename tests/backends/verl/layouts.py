"""Batches in verl 0.9.1's V1 (TransferQueue) layout, built with verl's own helpers.

Every per-token field is a nested (jagged) tensor: ``prompts`` (B, p_i), ``responses`` and
``response_mask`` (B, r_i), ``input_ids`` (B, p_i + r_i); a model output (``log_probs``,
``credit_unsigned_work``) has the ``input_ids`` layout, the value at j about token j + 1.
"""

from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDict
from verl.protocol import DataProto
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl.workers.utils.padding import response_to_nested


def nested(rows: list[torch.Tensor]) -> torch.Tensor:
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def v1_batch(prompt_lens: list[int], resp_lens: list[int], vocab: int, seed: int = 0) -> TensorDict:
    """Random token ids in the V1 layout (every response mask all ones: single turn), with
    verl's ``loss_mask`` (the response mask) and ``position_ids``."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, vocab, (p,), generator=g) for p in prompt_lens]
    responses = [torch.randint(3, vocab, (r,), generator=g) for r in resp_lens]
    masks = [torch.ones(r, dtype=torch.long) for r in resp_lens]
    lengths = [p + r for p, r in zip(prompt_lens, resp_lens, strict=True)]
    return TensorDict(
        {
            "prompts": nested(prompts),
            "responses": nested(responses),
            "response_mask": nested(masks),
            "loss_mask": nested(masks),
            "input_ids": nested([torch.cat(pr) for pr in zip(prompts, responses, strict=True)]),
            "position_ids": nested([torch.arange(n) for n in lengths]),
        },
        batch_size=len(prompt_lens),
    )


def verl_grpo(scores: torch.Tensor, resp_lens: list[int], group: int) -> torch.Tensor:
    """verl's own GRPO advantages (B, T) through ``compute_advantage`` (the trainer's call),
    for outcome ``scores`` (B,) placed at each response's last token."""
    B, T = len(resp_lens), max(resp_lens)
    mask = torch.zeros(B, T, dtype=torch.float32)
    rewards = torch.zeros(B, T)
    for i, r in enumerate(resp_lens):
        mask[i, :r] = 1
        rewards[i, r - 1] = scores[i]
    data = DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": mask},
        non_tensors={"uid": np.array([f"p{i // group}" for i in range(B)], dtype=object)},
    )
    out = compute_advantage(data, adv_estimator="grpo", norm_adv_by_std_in_grpo=True)
    advantages: torch.Tensor = out.batch["advantages"]
    return advantages


def as_stored(advantages: torch.Tensor, batch: TensorDict) -> torch.Tensor:
    """(B, T) advantages as verl's V1 trainer stores them in TransferQueue (nested)."""
    stored: torch.Tensor = response_to_nested(advantages, batch["response_mask"])
    return stored
