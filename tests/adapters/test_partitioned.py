"""Weights read outside a forward under fake ZeRO-3 partitions: the reward model's embedding
table (TRL's reward model as a direction model), and ``gathered`` itself."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from adapters import partitioned
from adapters.partitioned import gathered
from adapters.reward_models import SeqClassificationRM
from adapters.tiny import tiny_seq_classifier
from tests.helpers.adapters import bpe_tokenizer
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
