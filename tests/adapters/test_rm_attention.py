"""ABC's signal: the direction model's last-layer attention in its pooled row.

Each kind's alpha is checked against an independent recomputation from the model alone: a
deep copy switched to eager attention runs each row on its own, unpadded, as the RM
tokenizer itself encodes it (``tokenizer(prompt, response)``), with
``output_attentions=True``; last layer, mean over heads, the row the model pools ([CLS] for
BERT, the last token for Llama, the mean of all rows for a mean-pooled encoder), at the
response's tokens (sequence id 1 of a pair, 0 of a single input), renormalized. Through
the vocabulary bridge the RM tokens' mass is then shared among policy tokens by character
overlap, with the policy tokens' spans read off decoded prefixes of the policy ids.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from adapters.direction import DirectionModel, EmbeddingDirectionModel, RewardOutput
from adapters.reward_models import (
    EncoderSimilarityRM,
    ModuleRM,
    SeqClassificationRM,
    classifier_pooling,
)
from adapters.scorers import CallableScorer, ModelScorer, RewardSignals
from adapters.tiny import tiny_encoder, tiny_seq_classifier
from credit_core import CreditError
from tests.helpers.adapters import (
    PROMPTS,
    RESPONSES,
    TARGET,
    bpe_tokenizer,
    encode,
    minilm_tokenizer,
    rollout_batch,
    text_batch,
)

pytestmark = pytest.mark.usefixtures("single_torch_thread")

F64 = torch.float64


@dataclass(frozen=True)
class Kind:
    """A direction model, the HF model inside it, how it pools, and its policy tokenizer."""

    dm: EmbeddingDirectionModel
    model: Any
    pooled: Callable[[torch.Tensor], torch.Tensor]  # (L, L) head-mean rows -> (L,)
    pair: bool
    policy_tokenizer: Any
    token_types: bool = True  # the model reads token_type_ids


def _bert(policy: Any) -> Kind:
    model = tiny_seq_classifier("bert", len(minilm_tokenizer()), hidden=16, dtype=F64)
    dm = SeqClassificationRM(model, minilm_tokenizer(), policy)
    return Kind(dm, model, lambda rows: rows[0], True, policy)


def _llama(dtype: torch.dtype = torch.float32) -> Kind:
    """(float32: see ``test_a_float64_decoder_says_why_its_padded_rows_are_nan``.)"""
    tok = minilm_tokenizer()
    model = tiny_seq_classifier("llama", len(tok), hidden=16, dtype=dtype)
    dm = SeqClassificationRM(model, tok, tok)
    return Kind(dm, model, lambda rows: rows[-1], True, tok, token_types=False)


def _encoder() -> Kind:
    tok = minilm_tokenizer()
    model = tiny_encoder(len(tok), hidden=16, dtype=F64)
    dm = EncoderSimilarityRM(model, tok, tok, TARGET)
    return Kind(dm, model, lambda rows: rows.mean(dim=0), False, tok)


KINDS: dict[str, Callable[[], Kind]] = {
    "bert_classifier": lambda: _bert(minilm_tokenizer()),
    "llama_classifier": _llama,
    "encoder_similarity": _encoder,
    "bridged_bert_classifier": lambda: _bert(bpe_tokenizer()),
}


@pytest.fixture(scope="module", params=sorted(KINDS))
def kind(request: pytest.FixtureRequest) -> Kind:
    return KINDS[request.param]()


def _rm_alpha(kind: Kind, prompt: str, response: str) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """alpha over the RM's response tokens of one row, and their character offsets."""
    tok = minilm_tokenizer()
    args = (prompt, response) if kind.pair else (response,)
    enc = tok(*args, return_offsets_mapping=True)
    eager = copy.deepcopy(kind.model)
    eager.set_attn_implementation("eager")
    inputs = {"input_ids": torch.tensor([enc["input_ids"]])}
    if kind.token_types:
        inputs["token_type_ids"] = torch.tensor([enc["token_type_ids"]])
    with torch.no_grad():
        out = eager(**inputs, output_attentions=True)
    row = kind.pooled(out.attentions[-1][0].mean(dim=0))
    response_id = 1 if kind.pair else 0
    where = [i for i, s in enumerate(enc.sequence_ids()) if s == response_id]
    alpha = row[where] / row[where].sum()
    return alpha, [enc["offset_mapping"][i] for i in where]


def _policy_spans(tokenizer: Any, ids: Sequence[int]) -> list[tuple[int, int]]:
    """Each policy token's character span, from the lengths of decoded prefixes (ASCII)."""
    ends = [len(tokenizer.decode(list(ids[: j + 1]))) for j in range(len(ids))]
    return list(zip([0, *ends[:-1]], ends, strict=True))


def _expected_alpha(kind: Kind, b: int) -> torch.Tensor:
    rm_alpha, rm_spans = _rm_alpha(kind, PROMPTS[b], RESPONSES[b])
    if kind.policy_tokenizer is minilm_tokenizer():
        return rm_alpha
    ids = encode(kind.policy_tokenizer, [RESPONSES[b]])[0]
    share = torch.zeros(len(ids), len(rm_spans), dtype=F64)
    for j, (ps, pe) in enumerate(_policy_spans(kind.policy_tokenizer, ids)):
        for k, (rs, re_) in enumerate(rm_spans):
            share[j, k] = max(0, min(pe, re_) - max(ps, rs))
    alpha = (share / share.sum(dim=0)) @ rm_alpha
    return alpha / alpha.sum()


def test_alpha_equals_a_plain_eager_forward_of_each_row(kind: Kind) -> None:
    batch = text_batch(kind.policy_tokenizer)
    out = kind.dm.score(*batch, with_grad=False, with_attention=True)
    assert out.attention is not None and out.attention.dtype == torch.float32
    assert tuple(out.attention.shape) == tuple(batch[2].shape)
    for b in range(len(RESPONSES)):
        n = int(batch[3][b].sum())
        expected = _expected_alpha(kind, b).float()
        assert expected.shape == (n,)
        torch.testing.assert_close(out.attention[b, :n], expected, rtol=1e-5, atol=1e-6)
        assert bool((out.attention[b, n:] == 0).all())


def test_the_attention_comes_from_the_reward_forward_itself(kind: Kind) -> None:
    forwards = []
    handle = kind.model.register_forward_hook(lambda *_: forwards.append(1))
    batch = text_batch(kind.policy_tokenizer)
    try:
        plain = kind.dm.score(*batch, with_grad=True)
        forwards.clear()
        out = kind.dm.score(*batch, with_grad=True, with_attention=True)
    finally:
        handle.remove()
    assert len(forwards) == 1
    assert kind.model.config._attn_implementation == "sdpa"  # switched back after the call
    torch.testing.assert_close(out.rewards, plain.rewards, rtol=1e-5, atol=1e-7)
    assert out.reward_grad is not None and plain.reward_grad is not None
    torch.testing.assert_close(out.reward_grad, plain.reward_grad, rtol=1e-4, atol=1e-7)
    assert plain.attention is None and plain.prefix_rewards is None


def test_alpha_sums_to_one_over_the_response_and_is_zero_elsewhere() -> None:
    """Rows whose score position puts no mass on a response token are all 0: an empty
    response, and (through the bridge) a response of policy special tokens, whose text is
    empty."""
    bpe, tok = bpe_tokenizer(), minilm_tokenizer()
    prompts = [*PROMPTS[:2], "Hi", "Hello there"]
    special = [bpe.eos_token_id, bpe.eos_token_id]
    batches = {
        tok: rollout_batch(encode(tok, prompts), [*encode(tok, RESPONSES[:2]), [], []]),
        bpe: rollout_batch(encode(bpe, prompts), [*encode(bpe, RESPONSES[:2]), [], special]),
    }
    for policy, batch in batches.items():
        out = _bert(policy).dm.score(*batch, with_grad=False, with_attention=True)
        assert out.attention is not None
        mask = batch[3].bool()
        assert bool((out.attention >= 0).all()) and bool((out.attention[~mask] == 0).all())
        torch.testing.assert_close(out.attention[:2].sum(dim=1), torch.ones(2))
        assert bool((out.attention[2:] == 0).all())


class SumRM(torch.nn.Module):
    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return (inputs_embeds.sum(dim=2) * attention_mask).sum(dim=1)


def test_a_module_rm_has_no_attention_and_says_what_is_missing() -> None:
    V = len(bpe_tokenizer())
    table = torch.randn(V, 8, generator=torch.Generator().manual_seed(0))
    dm = ModuleRM(SumRM(), table, policy_vocab_size=V)
    assert not dm.gives_attention
    batch = text_batch(bpe_tokenizer())
    message = r"module reward model .* has no attention.*ABC needs a transformer reward model"
    with pytest.raises(CreditError, match=message):
        dm.score(*batch, with_grad=False, with_attention=True)
    with pytest.raises(CreditError, match="attention: ModuleRM gives no attention"):
        RewardSignals(ModelScorer(dm), dm).compute(*batch, with_grad=False, with_attention=True)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_which_classifiers_give_attention_is_known_without_scoring() -> None:
    from transformers import BartConfig, BertConfig, LlamaConfig, ModernBertConfig

    assert classifier_pooling(BertConfig()) == "first"
    assert classifier_pooling(LlamaConfig()) == "last"
    assert classifier_pooling(ModernBertConfig(classifier_pooling="cls")) == "first"
    assert classifier_pooling(ModernBertConfig(classifier_pooling="mean")) == "mean"
    assert classifier_pooling(BartConfig()) is None  # pools its EOS token: not read
    from transformers import AutoModelForSequenceClassification, DebertaV2Config

    config = DebertaV2Config(
        vocab_size=len(minilm_tokenizer()),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        num_labels=1,
    )
    deberta = AutoModelForSequenceClassification.from_config(config).eval()
    dm = SeqClassificationRM(deberta, minilm_tokenizer(), minilm_tokenizer())
    assert not dm.gives_attention
    with pytest.raises(CreditError, match=r"_can_record_outputs\['attentions'\]"):
        dm.score(*text_batch(minilm_tokenizer()), with_grad=False, with_attention=True)


def test_a_float64_decoder_says_why_its_padded_rows_are_nan() -> None:
    dm = _llama(F64).dm
    with pytest.raises(CreditError, match=r"non-finite last-layer attention.*float32 or bfloat16"):
        dm.score(*text_batch(minilm_tokenizer()), with_grad=False, with_attention=True)


class OldStyleDirection(DirectionModel):
    """A user's direction model written before the attention / prefix-reward flags."""

    def __init__(self, inner: DirectionModel) -> None:
        self.inner = inner
        self.reward_embedding = inner.reward_embedding

    def score(  # type: ignore[override]
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        response_ids: torch.Tensor,
        response_mask: torch.Tensor,
        *,
        with_grad: bool,
    ) -> RewardOutput:
        return self.inner.score(
            prompt_ids, prompt_mask, response_ids, response_mask, with_grad=with_grad
        )


def test_a_separate_scorer_keeps_the_direction_models_attention() -> None:
    kind = _bert(bpe_tokenizer())
    batch = text_batch(bpe_tokenizer())
    scorer = CallableScorer(lambda p, r: [float(len(x)) for x in r], bpe_tokenizer())
    out = RewardSignals(scorer, kind.dm).compute(*batch, with_grad=False, with_attention=True)
    own = kind.dm.score(*batch, with_grad=False, with_attention=True)
    torch.testing.assert_close(out.rewards, torch.tensor([float(len(r)) for r in RESPONSES]))
    assert out.attention is not None and own.attention is not None
    torch.testing.assert_close(out.attention, own.attention)
    assert out.reward_grad is None and out.prefix_rewards is None
    # a direction model that predates the flags still serves the gradient, and refuses ABC
    old = RewardSignals(scorer, OldStyleDirection(kind.dm))
    assert old.compute(*batch, with_grad=True).reward_grad is not None
    with pytest.raises(CreditError, match="OldStyleDirection gives no attention"):
        old.compute(*batch, with_grad=False, with_attention=True)
    with pytest.raises(CreditError, match="attention was asked for, but no direction model"):
        RewardSignals(scorer).compute(*batch, with_grad=False, with_attention=True)
