"""Weights read outside a forward, under fake ZeRO-3 partitions and a one-rank FSDP2 wrap:
the reward model's embedding table (TRL's reward model as a direction model) and the
policy's LM head and decoder read by the path gradient (``datc_mid``, ``datc_ig``)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from adapters import partitioned
from adapters.grad_path import PolicyExpectedEmbeddings
from adapters.partitioned import gathered
from adapters.reward_models import SeqClassificationRM
from adapters.tiny import tiny_causal_lm, tiny_seq_classifier
from tests.helpers.adapters import bpe_tokenizer
from tests.helpers.one_rank import one_rank_group
from tests.helpers.zero3 import FakeZero3

V = 64


def test_a_zero3_reward_model_gives_its_whole_embedding_table(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """TRL prepares a reward model with ZeRO-3 at stage 3: outside a forward its parameters
    are empty partitions; the direction model's table is read gathered, and kept whole."""
    tok = bpe_tokenizer()
    rm = tiny_seq_classifier("llama", len(tok), pad_token_id=int(tok.pad_token_id))
    expected = rm.get_input_embeddings().weight.detach().clone()
    zero3 = FakeZero3(monkeypatch)
    zero3.partition(*rm.parameters())
    direction = SeqClassificationRM(rm, tok, policy_vocab_size=len(tok))
    assert zero3.gathers == 1
    torch.testing.assert_close(direction.reward_embedding, expected)
    assert rm.get_input_embeddings().weight.shape == (0,)  # partitioned again


def policy_and_batch() -> tuple[torch.nn.Module, torch.Tensor, tuple[torch.Tensor, ...]]:
    model = tiny_causal_lm("llama", V, tie=False, seed=0).eval()
    g = torch.Generator().manual_seed(0)
    embedding = torch.randn(V, 8, generator=g)
    prompt = torch.randint(1, V, (2, 3), generator=g)
    response = torch.randint(1, V, (2, 4), generator=g)
    masks = torch.ones_like(prompt), torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    return model, embedding, (prompt, masks[0], response, masks[1])


def test_the_path_gradient_reads_a_zero3_partitioned_lm_head_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Outside the forward the LM head is an empty partition (the decoder's modules gather
    their own in their forwards); m1 is the one of the whole policy."""
    model, embedding, batch = policy_and_batch()
    expected = PolicyExpectedEmbeddings(model, embedding, 0.7)(*batch)
    zero3 = FakeZero3(monkeypatch)
    zero3.partition(model.get_output_embeddings().weight)
    got = PolicyExpectedEmbeddings(model, embedding, 0.7)(*batch)
    torch.testing.assert_close(got, expected)
    assert zero3.gathers == 1


def test_the_path_gradient_reads_an_fsdp2_policy_through_its_root() -> None:
    """FSDP2 as accelerate wraps a policy (every decoder layer, then the root): the root's
    own parameters stay DTensor shards outside its forward, so ``get_decoder()`` alone mixed
    Tensor and DTensor; m1 equals the unwrapped policy's."""
    from torch.distributed.fsdp import fully_shard

    model, embedding, batch = policy_and_batch()
    expected = PolicyExpectedEmbeddings(copy.deepcopy(model), embedding, 0.7)(*batch)
    with one_rank_group():
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        got = PolicyExpectedEmbeddings(model, embedding, 0.7)(*batch)
        assert type(model.get_output_embeddings().weight).__name__ == "DTensor"  # resharded
    torch.testing.assert_close(got, expected)


class _FakeStatus:
    AVAILABLE = "available"
    NOT_AVAILABLE = "not_available"


def test_gathered_uses_deepspeed_for_zero3_partitions(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ZeRO-3 partition (``ds_status`` not AVAILABLE) is gathered once (tied duplicates),
    read-only (modifier_rank None); whole parameters are left alone."""
    deepspeed = pytest.importorskip("deepspeed")
    calls: list[tuple[list[Any], Any]] = []

    class Recorder:
        def __init__(self, params: list[Any], modifier_rank: Any = "unset") -> None:
            calls.append((params, modifier_rank))

        def __enter__(self) -> None:
            return None

        def __exit__(self, *exc: Any) -> None:
            return None

    monkeypatch.setattr(deepspeed.zero, "GatheredParameters", Recorder)
    monkeypatch.setattr(partitioned, "_available", lambda p: p.ds_status == _FakeStatus.AVAILABLE)
    part, whole = torch.nn.Parameter(torch.empty(0)), torch.nn.Parameter(torch.ones(2))
    part.ds_status = _FakeStatus.NOT_AVAILABLE  # type: ignore[attr-defined]
    whole.ds_status = _FakeStatus.AVAILABLE  # type: ignore[attr-defined]
    with gathered(part, part, whole, None):
        pass
    assert calls == [([part], None)]
    with gathered(whole, torch.zeros(3)):
        pass
    assert len(calls) == 1
