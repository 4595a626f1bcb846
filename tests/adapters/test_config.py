"""``build_direction_model`` under a live DeepSpeed ZeRO-3 config (``adapters.config``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("deepspeed")

from adapters.config import build_direction_model
from adapters.tiny import tiny_seq_classifier
from tests.helpers.adapters import bpe_tokenizer
from tests.helpers.one_rank import one_rank_group
from tests.helpers.zero3 import FakeZero3


def test_a_direction_model_loads_whole_under_a_live_zero3_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TRL's trainer under ZeRO-3 holds a live stage-3 ``HfDeepSpeedConfig`` when it builds
    an explicit ``direction:``: ``from_pretrained`` would build it inside
    ``deepspeed.zero.Init`` (shape-[0] partitions that nothing gathers, no engine wraps it).
    The direction model is loaded outside ZeRO-3's init instead: whole weights, equal to
    the saved ones, the same reward as without DeepSpeed; the config is live again after."""
    from transformers.integrations import is_deepspeed_zero3_enabled

    tok = bpe_tokenizer()
    saved = tiny_seq_classifier("llama", len(tok), pad_token_id=int(tok.pad_token_id), seed=1)
    saved.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    cfg = {"kind": "seq_classification", "path": str(tmp_path)}
    zero3 = FakeZero3(monkeypatch)
    with one_rank_group(), zero3.live_config():
        assert is_deepspeed_zero3_enabled()
        direction = build_direction_model(cfg, tok)
        assert is_deepspeed_zero3_enabled()
    plain = build_direction_model(cfg, tok)
    model = direction.modules[0]  # type: ignore[attr-defined]
    for (name, p), expected in zip(model.named_parameters(), saved.parameters(), strict=True):
        assert not hasattr(p, "ds_id"), name
        torch.testing.assert_close(p, expected, msg=name)
    ids = torch.tensor([[5, 6, 7]])
    ones = torch.ones_like(ids)
    ours = direction.score(ids, ones, ids, ones, with_grad=True)
    theirs = plain.score(ids, ones, ids, ones, with_grad=True)
    torch.testing.assert_close(ours.rewards, theirs.rewards)
    assert ours.reward_grad is not None and theirs.reward_grad is not None
    torch.testing.assert_close(ours.reward_grad, theirs.reward_grad)
