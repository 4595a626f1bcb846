"""RED's signal: prefix rewards r_t = s_{t+1} - s_t from the direction model.

The reference is an explicit Python loop over prefixes: each row's response cut to its first
t tokens, scored on its own with ``score(with_grad=False)``. Every kind must match it: the
BERT pair template (its final [SEP] follows each cut), a ``ModuleRM`` reading the response
alone (whose empty prefix is not scored: s_0 = 0), the vocabulary bridge (cut policy tokens
re-tokenized), and a causal classifier that reads every prefix off its one reward forward.
The rewards telescope: sum_t r_t = reward - s_0, and r_t is exactly 0 at padding.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from ablations.sparse_tasks import positional_reward_model
from adapters.direction import EmbeddingDirectionModel
from adapters.grad_path import PathGradientDirection
from adapters.reward_models import ModuleRM, SeqClassificationRM
from adapters.scorers import CallableScorer, RewardSignals
from adapters.tiny import tiny_seq_classifier
from tests.helpers.adapters import (
    PROMPTS,
    RESPONSES,
    bpe_tokenizer,
    encode,
    minilm_tokenizer,
    rollout_batch,
    text_batch,
)

pytestmark = pytest.mark.usefixtures("single_torch_thread")

F64 = torch.float64
Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _batch(policy: Any) -> Batch:
    """Three rows of different lengths and an empty response."""
    prompts = [*PROMPTS, "Hi"]
    return rollout_batch(encode(policy, prompts), [*encode(policy, RESPONSES), []])


def loop_scores(dm: EmbeddingDirectionModel, batch: Batch) -> list[list[float]]:
    """s_0 .. s_{n_b} of each row, one ``score`` call per prefix."""
    pid, pm, rid, rm = batch
    rows = []
    for b in range(rid.shape[0]):
        n = int(rm[b].sum())
        s = []
        for t in range(n + 1):
            cut = torch.zeros(1, max(t, 1), dtype=torch.long)
            cut[0, :t] = rid[b, :t]
            mask = (torch.arange(cut.shape[1]) < t).long().unsqueeze(0)
            s.append(
                float(dm.score(pid[b : b + 1], pm[b : b + 1], cut, mask, with_grad=False).rewards)
            )
        rows.append(s)
    return rows


def check_against_loop(dm: EmbeddingDirectionModel, batch: Batch) -> torch.Tensor:
    out = dm.score(*batch, with_grad=False, with_prefix_rewards=True)
    pr = out.prefix_rewards
    assert pr is not None and pr.dtype == torch.float32 and pr.shape == batch[2].shape
    s = loop_scores(dm, batch)
    scale = max(abs(v) for row in s for v in row)
    for b, row in enumerate(s):
        n = len(row) - 1
        expected = torch.tensor([row[t + 1] - row[t] for t in range(n)], dtype=torch.float32)
        torch.testing.assert_close(pr[b, :n], expected, rtol=1e-4, atol=1e-6 * scale)
        assert bool((pr[b, n:] == 0).all())
        # telescoping: the prefix rewards sum to the reward minus s_0
        torch.testing.assert_close(
            pr[b].double().sum(), out.rewards[b].double() - row[0], rtol=1e-4, atol=1e-6 * scale
        )
        assert float(out.rewards[b]) == pytest.approx(row[n], rel=1e-5, abs=1e-7 * scale)
    return pr


def _counting(model: torch.nn.Module) -> tuple[list[int], Callable[[], None]]:
    calls: list[int] = []
    handle = model.register_forward_hook(lambda *_: calls.append(1))
    return calls, handle.remove


def test_bert_pair_prefix_rewards_equal_the_loop_in_any_chunking() -> None:
    tok = minilm_tokenizer()
    model = tiny_seq_classifier("bert", len(tok), hidden=16, dtype=F64)
    dm = SeqClassificationRM(model, tok, tok)
    assert dm.position_scores_recorder is None  # encoder: its score reads [CLS]
    batch = _batch(tok)
    pr = check_against_loop(dm, batch)
    dm.prefix_batch_rows = 3
    calls, remove = _counting(model)
    again = dm.score(*batch, with_grad=True, with_prefix_rewards=True)
    remove()
    n_prefixes = int(batch[3].sum())  # t = n_b is the reward forward itself
    assert len(calls) == 1 + -(-n_prefixes // 3)
    assert again.prefix_rewards is not None and again.reward_grad is not None
    torch.testing.assert_close(again.prefix_rewards, pr)


def test_a_module_rm_on_the_response_alone_scores_no_empty_input() -> None:
    """The positional RM's reward is a sum of per-token terms at scored positions, so its
    prefix rewards are exactly those terms: f(E[y_t]) / |S| at t in S, 0 elsewhere."""
    V, positions = 50, [0, 2, 5]
    rm, table = positional_reward_model(V, positions, embed_dim=8, seed=3)
    dm = ModuleRM(rm, table, policy_vocab_size=V, include_prompt=False)
    gen = torch.Generator().manual_seed(0)
    lengths = [7, 3, 0, 6]
    responses = [torch.randint(0, V, (n,), generator=gen).tolist() for n in lengths]
    batch = rollout_batch([[1, 2]] * 4, responses)
    pr = check_against_loop(dm, batch)
    terms = rm.token_scores(table[batch[2]]) / len(positions)
    scored = torch.zeros_like(pr, dtype=torch.bool)
    scored[:, positions] = True
    expected = torch.where(scored & batch[3].bool(), terms, 0.0)
    torch.testing.assert_close(pr, expected.float(), rtol=1e-5, atol=1e-6)


def test_bridged_prefixes_are_the_cut_texts_re_tokenized() -> None:
    tok, bpe = minilm_tokenizer(), bpe_tokenizer()
    model = tiny_seq_classifier("bert", len(tok), hidden=16, dtype=F64)
    dm = SeqClassificationRM(model, tok, bpe)
    assert not dm.identical_vocab
    check_against_loop(dm, _batch(bpe))


def _llama_on_bpe(**kwargs: Any) -> SeqClassificationRM:
    """Float32: a float64 decoder's eager attention (ABC) turns padded rows to NaN."""
    bpe = bpe_tokenizer()
    model = tiny_seq_classifier("llama", len(bpe), hidden=16, pad_token_id=1)
    return SeqClassificationRM(model, bpe, bpe, **kwargs)


def test_a_causal_classifier_reads_every_prefix_off_its_one_forward() -> None:
    """The BPE tokenizer adds no special tokens: no suffix follows the response, so the score
    at each response position is the score of that prefix."""
    dm = _llama_on_bpe()
    assert dm.template.suffix == () and dm.position_scores_recorder is not None
    batch = _batch(bpe_tokenizer())
    calls, remove = _counting(dm.model)
    out = dm.score(*batch, with_grad=True, with_attention=True, with_prefix_rewards=True)
    remove()
    assert len(calls) == 1
    assert out.prefix_rewards is not None and out.attention is not None
    # the general path: one forward per prefix chunk
    s = dm.prefix_scores(*batch)
    n = batch[3].sum(dim=1)
    t = torch.arange(s.shape[1])
    following = torch.where(t == (n - 1).unsqueeze(1), out.rewards.unsqueeze(1), s.roll(-1, 1))
    general = torch.where(t < n.unsqueeze(1), following - s, 0.0)
    torch.testing.assert_close(out.prefix_rewards, general.float(), rtol=1e-5, atol=1e-6)
    check_against_loop(dm, batch)


def test_truncated_rows_and_suffixes_take_the_general_path() -> None:
    """A row at max_length may have lost prompt tokens that a shorter prefix keeps; a suffix
    ([SEP]) follows every cut: neither is read off the full sequence."""
    truncating = _llama_on_bpe(max_length=12)
    batch = _batch(bpe_tokenizer())
    calls, remove = _counting(truncating.model)
    out = truncating.score(*batch, with_grad=False, with_prefix_rewards=True)
    remove()
    assert out.diagnostics["rm/truncated_tokens"] > 0
    assert len(calls) == 2  # the reward forward, then one chunk of prefixes
    check_against_loop(truncating, batch)
    tok = minilm_tokenizer()
    model = tiny_seq_classifier("llama", len(tok), hidden=16, dtype=F64)
    with_suffix = SeqClassificationRM(model, tok, tok)
    assert with_suffix.template.suffix and with_suffix.position_scores_recorder is None
    check_against_loop(with_suffix, _batch(tok))


def test_the_signals_pass_prefix_rewards_through_a_scorer_and_the_path_wrapper() -> None:
    dm = _llama_on_bpe()
    batch = text_batch(bpe_tokenizer())
    own = dm.score(*batch, with_grad=False, with_attention=True, with_prefix_rewards=True)
    assert own.prefix_rewards is not None and own.attention is not None
    scorer = CallableScorer(lambda p, r: [1.0] * len(r), bpe_tokenizer())
    out = RewardSignals(scorer, dm).compute(*batch, with_grad=False, with_prefix_rewards=True)
    assert out.prefix_rewards is not None and out.attention is None
    torch.testing.assert_close(out.prefix_rewards, own.prefix_rewards)
    torch.testing.assert_close(out.rewards, torch.ones(3))
    assert out.diagnostics["rm/direction_model_reward_mean"] == pytest.approx(
        float(own.rewards.mean())
    )

    def expected(*_: torch.Tensor) -> torch.Tensor:
        return torch.zeros(*batch[2].shape, dm.embed_dim)

    wrapped = PathGradientDirection(dm, expected, 1)
    assert wrapped.gives_attention
    both = wrapped.score(*batch, with_grad=True, with_attention=True, with_prefix_rewards=True)
    assert both.reward_grad is not None and both.prefix_rewards is not None
    torch.testing.assert_close(both.prefix_rewards, own.prefix_rewards)
    assert both.attention is not None
    torch.testing.assert_close(both.attention, own.attention)
