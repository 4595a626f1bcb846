"""Rollout samples from softmax(logits / T) over the full vocabulary, whatever the model's
own generation defaults say, and the old-policy log-probs are of that same distribution."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from adapters.policy import response_logprobs_and_stats
from adapters.tiny import tiny_causal_lm
from backends.torch.config import RolloutConfig
from backends.torch.rollout import (
    HFRolloutEngine,
    RolloutBatch,
    encode_prompts,
    response_mask_from_eos,
    sampling_config,
)

pytestmark = pytest.mark.usefixtures("single_torch_thread")

V, EOS, PAD, T = 61, 1, 0, 0.7


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    m = tiny_causal_lm("llama", V, hidden=32, seed=3, pad_token_id=PAD, eos_token_id=EOS)
    # defaults a model may ship with: all must be overridden by the rollout
    m.generation_config.top_k = 50
    m.generation_config.top_p = 0.8
    m.generation_config.repetition_penalty = 1.5
    return m


def prompts() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.tensor([[PAD, PAD, 5, 6, 7], [8, 9, 10, 11, 12], [PAD, PAD, PAD, 13, 14]])
    return ids, ids != PAD


def test_processed_scores_are_exactly_the_logits_over_temperature(model: torch.nn.Module) -> None:
    ids, mask = prompts()
    gen_cfg = sampling_config(
        max_new_tokens=5,
        temperature=T,
        top_k=0,
        top_p=1.0,
        greedy=False,
        pad_id=PAD,
        eos_ids=[EOS],
    )
    gen_cfg.update(output_scores=True, output_logits=True, return_dict_in_generate=True)
    torch.manual_seed(0)
    out = model.generate(input_ids=ids, attention_mask=mask.long(), generation_config=gen_cfg)
    for scores, logits in zip(out.scores, out.logits, strict=True):
        assert bool(torch.isfinite(scores).all()), "a logits processor masked tokens out"
        torch.testing.assert_close(scores, logits / T, rtol=0, atol=1e-6)


def test_the_models_own_defaults_would_truncate(model: torch.nn.Module) -> None:
    """Control: without the explicit settings, generate applies top-k/top-p (this test
    fails if transformers stops doing that, and the explicit settings become moot)."""
    ids, mask = prompts()
    out = model.generate(
        input_ids=ids,
        attention_mask=mask.long(),
        do_sample=True,
        temperature=T,
        max_new_tokens=2,
        output_scores=True,
        return_dict_in_generate=True,
        pad_token_id=PAD,
    )
    assert not bool(torch.isfinite(out.scores[0]).all())


def test_old_logprobs_are_of_the_distribution_sampled_from(model: torch.nn.Module) -> None:
    """log p_old(y_t) from the trainer's no-grad pass == log_softmax(generate's logits / T)."""
    ids, mask = prompts()
    engine = HFRolloutEngine(
        model, RolloutConfig(max_new_tokens=6, temperature=T), pad_id=PAD, eos_ids=[EOS]
    )
    batch = engine.generate(ids, mask, torch.arange(3), group_size=2, greedy=False, seed=11)
    assert batch.size == 6 and torch.equal(batch.group, torch.tensor([0, 0, 1, 1, 2, 2]))
    logp, _ = response_logprobs_and_stats(
        model, batch.input_ids, batch.attention_mask, batch.response_len, temperature=T
    )
    # the reference: one sequence at a time, no padding, full logits
    for row in range(batch.size):
        prompt = batch.prompt_ids[row][batch.prompt_mask[row]]
        resp = batch.response_ids[row][batch.response_mask[row]]
        seq = torch.cat([prompt, resp]).unsqueeze(0)
        logits = model(input_ids=seq).logits[0, len(prompt) - 1 : -1]
        expected = torch.log_softmax(logits / T, dim=-1).gather(1, resp.unsqueeze(1)).squeeze(1)
        torch.testing.assert_close(logp[row, : len(resp)], expected, rtol=1e-5, atol=1e-5)
        assert torch.all(logp[row, len(resp) :] == 0)


def test_sampling_depends_only_on_the_seed(model: torch.nn.Module) -> None:
    ids, mask = prompts()
    engine = HFRolloutEngine(model, RolloutConfig(max_new_tokens=6), pad_id=PAD, eos_ids=[EOS])
    a = engine.generate(ids, mask, torch.arange(3), group_size=2, greedy=False, seed=5)
    torch.rand(10)  # the global RNG is neither used nor advanced by generate
    b = engine.generate(ids, mask, torch.arange(3), group_size=2, greedy=False, seed=5)
    c = engine.generate(ids, mask, torch.arange(3), group_size=2, greedy=False, seed=6)
    assert torch.equal(a.response_ids, b.response_ids)
    assert not torch.equal(a.response_ids, c.response_ids)


def test_response_mask_ends_at_the_first_eos() -> None:
    ids = torch.tensor([[4, EOS, 5, EOS], [4, 4, 4, 4], [EOS, 3, 3, 3]])
    expected = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    assert torch.equal(response_mask_from_eos(ids, [EOS]), expected)


def test_select_trims_padding_and_cat_restores_it() -> None:
    batch = RolloutBatch(
        prompt_ids=torch.tensor([[0, 0, 5], [0, 6, 7]]),
        prompt_mask=torch.tensor([[0, 0, 1], [0, 1, 1]], dtype=torch.bool),
        response_ids=torch.tensor([[8, 1, 0], [9, 9, 1]]),
        response_mask=torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool),
        group=torch.tensor([0, 1]),
        pad_id=0,
    )
    first = batch.select(slice(0, 1))
    assert first.prompt_len == 1 and first.response_len == 2
    assert first.prompt_ids.tolist() == [[5]] and first.response_ids.tolist() == [[8, 1]]
    again = RolloutBatch.cat([first, batch.select(slice(1, 2))])
    whole = batch.select(slice(None))  # the all-padding prompt column dropped
    assert whole.prompt_len == 2 and whole.response_len == 3
    assert whole.prompt_ids.tolist() == [[0, 5], [6, 7]]
    assert whole.prompt_mask.tolist() == [[False, True], [True, True]]
    assert whole.response_ids.tolist() == [[8, 1, 0], [9, 9, 1]]
    for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "group"):
        assert torch.equal(getattr(again, name), getattr(whole, name)), name


def test_chat_template_wraps_prompts_as_a_user_turn() -> None:
    from adapters.tiny import train_bpe_tokenizer

    tok = train_bpe_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    ids, mask = encode_prompts(tok, ["hi there", "a longer prompt"], 1, chat_template=True)
    assert tok.decode(ids[0][mask[0]]) == "user: hi there\nassistant:"
    assert not bool(mask[0, 0]) and bool(mask[1, 0])  # left-padded


def test_the_vllm_engine_says_how_to_get_vllm_when_it_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from backends.torch.rollout_vllm import VLLMRolloutEngine

    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    with pytest.raises(RuntimeError, match=r"rollout\.engine: 'vllm' needs the vllm package"):
        VLLMRolloutEngine("unused", RolloutConfig(), dtype="float32", pad_id=0, eos_ids=[1], seed=0)


def _real_vllm() -> bool:
    try:
        import vllm
    except ImportError:
        return False
    return hasattr(vllm, "LLM") and torch.cuda.is_available()  # tests/stubs has no LLM


@pytest.mark.skipif(not _real_vllm(), reason="needs the vllm package and a CUDA GPU")
def test_vllm_engine_samples_group_contiguous_responses(tmp_path: Path) -> None:
    from adapters.tiny import train_bpe_tokenizer
    from backends.torch.rollout_vllm import VLLMRolloutEngine

    tok = train_bpe_tokenizer()
    model = tiny_causal_lm("qwen2", len(tok), pad_token_id=tok.pad_token_id, eos_token_id=0)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    engine = VLLMRolloutEngine(
        str(tmp_path),
        RolloutConfig(max_new_tokens=5),
        dtype="float32",
        pad_id=int(tok.pad_token_id),
        eos_ids=[0],
        seed=0,
    )
    engine.sync_weights(model.cuda())
    ids, mask = encode_prompts(tok, ["hello there", "the cat"], int(tok.pad_token_id))
    batch = engine.generate(
        ids.cuda(), mask.cuda(), torch.arange(2).cuda(), group_size=3, greedy=False, seed=1
    )
    assert batch.size == 6 and batch.response_len <= 5
    assert torch.equal(batch.group.cpu(), torch.tensor([0, 0, 0, 1, 1, 1]))
    assert bool(batch.response_mask[:, 0].all())
