"""The vocabulary bridge: a byte-level BPE policy vs the MiniLM RM.

docs/design.md, "A reward model with another tokenizer".
"""

from __future__ import annotations

import pytest
import torch

from adapters.minilm import load_minilm
from adapters.reward_models import EncoderSimilarityRM, mean_pool
from adapters.vocab_bridge import VocabBridge
from credit_core import CreditError
from tests.helpers.adapters import (
    PROMPTS,
    RESPONSES,
    TARGET,
    bpe_tokenizer,
    encode,
    minilm,
    minilm_tokenizer,
    rollout_batch,
    text_batch,
)

pytestmark = pytest.mark.usefixtures("single_torch_thread")


@pytest.fixture(scope="module")
def bridge() -> VocabBridge:
    return VocabBridge.build(bpe_tokenizer(), minilm_tokenizer())


def test_identical_vocabularies_are_detected_and_the_bridge_is_the_identity() -> None:
    tok_a = minilm_tokenizer()
    tok_b = load_minilm()[1]  # loaded again: another object, same vocabulary
    assert tok_a is not tok_b
    bridge = VocabBridge.build(tok_a, tok_b)
    assert bridge.identical and bridge.n_empty == 0
    E = minilm()[0].get_input_embeddings().weight
    assert bridge.bridged_embedding(E) is E
    assert not VocabBridge.build(bpe_tokenizer(), tok_a).identical


def test_identical_tokenizers_move_gradients_position_by_position_exactly() -> None:
    model, tok = minilm()
    dm = EncoderSimilarityRM(model, tok, load_minilm()[1], TARGET)
    E = model.get_input_embeddings().weight
    assert dm.identical_vocab and dm.reward_embedding.data_ptr() == E.data_ptr()
    batch = text_batch(tok)
    out = dm.score(*batch, with_grad=True)
    x = dm.prepare(*batch)
    e = model.get_input_embeddings()(x.inputs.input_ids).detach().requires_grad_(True)
    assert dm.template.prefix == (tok.cls_token_id,) and dm.template.suffix == (tok.sep_token_id,)
    pooled = mean_pool(
        model(inputs_embeds=e, attention_mask=x.inputs.attention_mask).last_hidden_state,
        x.inputs.attention_mask,
    )
    reward = torch.nn.functional.cosine_similarity(pooled, dm.target.unsqueeze(0), dim=1)
    (g,) = torch.autograd.grad(reward.sum(), e)
    # response token j of row b sits at RM position 1 + j ([CLS] first, right padding)
    n = batch[3].sum(dim=1)
    assert out.reward_grad is not None
    for b in range(len(n)):
        assert torch.equal(out.reward_grad[b, : n[b]], g[b, 1 : 1 + n[b]])
        assert torch.all(out.reward_grad[b, n[b] :] == 0)


def test_bridges_are_cached_and_padded_lm_head_rows_are_empty(bridge: VocabBridge) -> None:
    bpe, tok = bpe_tokenizer(), minilm_tokenizer()
    assert VocabBridge.build(bpe, tok) is bridge
    padded = VocabBridge.build(bpe, tok, policy_vocab_size=len(bpe) + 8)
    assert padded is not bridge and padded.n_empty == bridge.n_empty + 8
    E = minilm()[0].get_input_embeddings().weight.detach()
    assert padded.bridged_embedding(E).shape == (len(bpe) + 8, E.shape[1])
    same = VocabBridge.build(tok, tok, policy_vocab_size=len(tok) + 2)
    E_same = same.bridged_embedding(E)
    assert (
        same.identical and same.n_empty == 2 and same.empty_ids.tolist() == [len(tok), len(tok) + 1]
    )
    assert torch.equal(E_same[: len(tok)], E) and torch.all(E_same[len(tok) :] == 0)


def test_empty_tokens_are_counted_and_get_zero_rows(bridge: VocabBridge) -> None:
    bpe = bpe_tokenizer()
    E = minilm()[0].get_input_embeddings().weight.detach()
    bridged = bridge.bridged_embedding(E)
    zero_rows = torch.nonzero((bridged == 0).all(dim=1)).flatten()
    assert torch.equal(zero_rows, bridge.empty_ids)
    assert bridge.n_empty == len(zero_rows) > 0
    empty = set(bpe.convert_ids_to_tokens(bridge.empty_ids.tolist()))
    # special tokens, a lone space, and bytes that are only part of a UTF-8 character
    assert {"<|endoftext|>", "<pad>", "Ġ", "Ã", "æĿ"} <= empty
    assert not bridge.receives[bridge.empty_ids].any()


def test_bridged_rows_are_the_mean_of_the_rm_rows_of_their_text(bridge: VocabBridge) -> None:
    bpe, tok = bpe_tokenizer(), minilm_tokenizer()
    E = minilm()[0].get_input_embeddings().weight.detach()
    bridged = bridge.bridged_embedding(E)

    def row(token: str) -> torch.Tensor:
        return bridged[bpe.convert_tokens_to_ids(token)]

    def rm(*tokens: str) -> torch.Tensor:
        return E[tok.convert_tokens_to_ids(list(tokens))].mean(dim=0)

    torch.testing.assert_close(row("Ġthe"), rm("the"), rtol=0, atol=0)  # " the" -> the
    torch.testing.assert_close(row("ing"), rm("ing"), rtol=0, atol=0)  # tokenized alone
    torch.testing.assert_close(row("'s"), rm("'", "s"), rtol=0, atol=1e-7)  # two RM tokens
    torch.testing.assert_close(row("fÃ©"), rm("fe"), rtol=0, atol=0)  # "fé", accent stripped


def test_gradients_are_shared_by_character_overlap(bridge: VocabBridge) -> None:
    """ "She is playing": RM "playing" (7 chars) -> policy " play" (4) and "ing" (3)."""
    bpe, tok = bpe_tokenizer(), minilm_tokenizer()
    ids = torch.tensor([bpe.encode("She is playing")])
    assert bpe.convert_ids_to_tokens(ids[0].tolist()) == ["She", "Ġis", "Ġplay", "ing"]
    spans = bridge.spans(ids, torch.ones_like(ids, dtype=torch.bool))
    assert spans.texts == ["She is playing"]
    assert spans.spans[0].tolist() == [[0, 3], [3, 6], [6, 11], [11, 14]]
    enc = tok("She is playing", add_special_tokens=False, return_offsets_mapping=True)
    assert enc["offset_mapping"] == [(0, 3), (4, 6), (7, 14)]
    g = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [7.0, 14.0]]])
    moved, dropped = VocabBridge.move_gradients(
        g, torch.tensor([enc["offset_mapping"]]), torch.ones(1, 3, dtype=torch.bool), spans.spans
    )
    assert not dropped.any()
    expected = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [4.0, 8.0], [3.0, 6.0]]])
    torch.testing.assert_close(moved, expected, rtol=0, atol=1e-6)


def test_gradient_mass_is_conserved_up_to_reported_drops(bridge: VocabBridge) -> None:
    model, tok = minilm()
    dm = EncoderSimilarityRM(model, tok, bpe_tokenizer(), TARGET)
    assert dm.bridge is bridge and dm.n_empty == bridge.n_empty
    responses = [*RESPONSES, "Café 東京, naïve résumé 🙂 done"]
    batch = rollout_batch(
        encode(bpe_tokenizer(), [*PROMPTS, "Hi"]), encode(bpe_tokenizer(), responses)
    )
    out = dm.score(*batch, with_grad=True)
    x = dm.prepare(*batch)
    assert x.rm_spans is not None and x.policy_spans is not None
    # the RM-side gradient, recomputed by hand from the prepared inputs
    mask = x.inputs.attention_mask
    e = model.get_input_embeddings()(x.inputs.input_ids).detach().requires_grad_(True)
    pooled = mean_pool(model(inputs_embeds=e, attention_mask=mask).last_hidden_state, mask)
    reward = torch.nn.functional.cosine_similarity(pooled, dm.target.unsqueeze(0), dim=1)
    (g,) = torch.autograd.grad(reward.sum(), e)
    pos = x.inputs.response_positions
    g_resp = g.gather(1, pos.unsqueeze(2).expand(*pos.shape, g.shape[2]))
    g_resp = g_resp * x.inputs.response_valid.unsqueeze(2)

    _, dropped = VocabBridge.move_gradients(
        g_resp, x.rm_spans, x.inputs.response_valid, x.policy_spans
    )
    assert out.reward_grad is not None
    kept = g_resp * (~dropped).unsqueeze(2)
    torch.testing.assert_close(out.reward_grad.sum(dim=1), kept.sum(dim=1), rtol=1e-5, atol=1e-6)
    # only the last response loses RM tokens: the CJK characters and the emoji, whose
    # bytes are spread over partial-byte (empty) policy tokens
    assert dropped[:3].sum() == 0
    rm_tokens = tok.convert_ids_to_tokens(x.inputs.input_ids[3, pos[3][dropped[3]]].tolist())
    assert rm_tokens == ["東", "京", "[UNK]"]
    assert out.diagnostics["bridge/dropped_rm_tokens"] == 3
    assert 0 < out.diagnostics["bridge/dropped_grad_fraction"] < 1
    # empty policy tokens receive nothing
    empty = torch.isin(batch[2], bridge.empty_ids) & batch[3].bool()
    assert empty.any() and torch.all(out.reward_grad[empty] == 0)


def test_rewards_through_the_bridge_equal_minilm_on_the_decoded_text() -> None:
    model, tok = minilm()
    dm = EncoderSimilarityRM(model, tok, bpe_tokenizer(), TARGET)
    rewards = dm.score(*text_batch(bpe_tokenizer()), with_grad=False).rewards
    enc = tok(list(RESPONSES), padding=True, return_tensors="pt")
    target = tok(TARGET, return_tensors="pt")
    with torch.no_grad():
        pooled = mean_pool(model(**enc).last_hidden_state, enc["attention_mask"])
        t = mean_pool(model(**target).last_hidden_state, target["attention_mask"])
    want = torch.nn.functional.cosine_similarity(pooled, t, dim=1)
    torch.testing.assert_close(rewards, want, rtol=0, atol=1e-5)


def test_text_spans_of_a_response_cut_inside_a_character(bridge: VocabBridge) -> None:
    bpe = bpe_tokenizer()
    full = bpe.encode("Café 東京")
    assert bpe.convert_ids_to_tokens(full) == ["Ca", "fÃ©", "Ġ", "æĿ", "±ä", "º", "¬"]
    cut = torch.tensor([full[:5]])  # ends after the first byte of 京: not valid UTF-8
    spans = bridge.spans(cut, torch.ones_like(cut, dtype=torch.bool))
    assert spans.texts == ["Café 東"]
    # "Ġ", "æĿ" and "±ä" are empty tokens: they own no characters
    assert spans.spans[0].tolist() == [[0, 2], [2, 4], [0, 0], [0, 0], [0, 0]]
    with pytest.raises(CreditError, match="ids: expected policy token ids"):
        bridge.spans(torch.tensor([[600]]), torch.ones(1, 1, dtype=torch.bool))
