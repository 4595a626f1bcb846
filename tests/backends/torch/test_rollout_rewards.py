"""RolloutRewards: micro-batched signals equal one direction-model call on the whole batch."""

from __future__ import annotations

import pytest
import torch

from adapters.reward_models import SeqClassificationRM
from adapters.scorers import ModelScorer, RewardSignals
from adapters.tiny import tiny_seq_classifier
from backends.torch.rollout import RolloutBatch
from backends.torch.rollout_rewards import RolloutRewards
from tests.helpers.adapters import bpe_tokenizer, encode, rollout_batch

pytestmark = pytest.mark.usefixtures("single_torch_thread")


def test_micro_batches_pad_attention_and_prefix_rewards_to_the_batch() -> None:
    bpe = bpe_tokenizer()
    model = tiny_seq_classifier("llama", len(bpe), hidden=16, pad_token_id=bpe.pad_token_id)
    dm = SeqClassificationRM(model, bpe, bpe)
    prompts = encode(bpe, ["Tell me a story.", "Hi", "What now?", "Go on."])
    # the first micro-batch's responses are shorter than the batch's: padded back
    responses = encode(
        bpe, ["A cat.", "Yes", "The cat sat on the mat and looked at the moon.", "No"]
    )
    pid, pm, rid, rm = rollout_batch(prompts, responses, pad=bpe.pad_token_id)
    batch = RolloutBatch(pid, pm.bool(), rid, rm.bool(), torch.tensor([0, 0, 1, 1]), 1)
    rewards = RolloutRewards(RewardSignals(ModelScorer(dm), dm))
    out = rewards.compute(
        batch, with_grad=True, micro_batch_size=2, with_attention=True, with_prefix_rewards=True
    )
    whole = dm.score(
        pid, pm, rid, rm, with_grad=True, with_attention=True, with_prefix_rewards=True
    )
    assert out.attention is not None and whole.attention is not None
    assert out.prefix_rewards is not None and whole.prefix_rewards is not None
    assert out.attention.shape == out.prefix_rewards.shape == rid.shape
    torch.testing.assert_close(out.rewards, whole.rewards, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.attention, whole.attention, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.prefix_rewards, whole.prefix_rewards, rtol=1e-5, atol=1e-6)
    padding = ~rm.bool()
    assert bool((out.attention[padding] == 0).all())
    assert bool((out.prefix_rewards[padding] == 0).all())
    plain = rewards.compute(batch, with_grad=False, micro_batch_size=2)
    assert plain.attention is None and plain.prefix_rewards is None and plain.reward_grad is None
