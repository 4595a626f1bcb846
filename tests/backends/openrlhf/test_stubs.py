"""The test-only ``flash_attn``/``vllm`` stand-ins behave like the real helpers they replace."""

from __future__ import annotations

import importlib

import pytest
import torch

from tests.helpers.openrlhf_stubs import STUBS_DIR, install_openrlhf_stubs


def test_padding_helpers_round_trip() -> None:
    install_openrlhf_stubs()
    bert_padding = importlib.import_module("flash_attn.bert_padding")
    x = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2, 4, 3)
    mask = torch.tensor([[1, 1, 0, 0], [0, 1, 1, 1]])
    tokens, indices, cu_seqlens, max_seqlen, used = bert_padding.unpad_input(x, mask)
    assert torch.equal(tokens, x[mask.bool()])
    assert indices.tolist() == [0, 1, 5, 6, 7]
    assert cu_seqlens.tolist() == [0, 2, 5] and cu_seqlens.dtype == torch.int32
    assert max_seqlen == 3 and used.tolist() == [2, 3]
    padded = bert_padding.pad_input(tokens, indices, 2, 4)
    assert torch.equal(padded, x * mask.unsqueeze(-1))
    assert torch.equal(bert_padding.index_first_axis(x.reshape(8, 3), indices), tokens)


def test_vllm_stub_offers_only_what_openrlhf_imports() -> None:
    install_openrlhf_stubs()
    vllm = importlib.import_module("vllm")
    if not str(getattr(vllm, "__file__", "")).startswith(str(STUBS_DIR)):
        pytest.skip("a real vllm is installed and takes precedence over the stub")
    params = vllm.SamplingParams(temperature=0.7, max_tokens=8)
    assert (params.temperature, params.max_tokens) == (0.7, 8)
    prompt = importlib.import_module("vllm.inputs").TokensPrompt(prompt_token_ids=[1, 2])
    assert prompt["prompt_token_ids"] == [1, 2]
    assert len(importlib.import_module("vllm.utils").random_uuid()) == 32
    try:
        vllm.LLM  # noqa: B018
    except AttributeError as exc:
        assert "vllm test stub" in str(exc)
    else:
        raise AssertionError("the stub must not pretend to offer an engine")
