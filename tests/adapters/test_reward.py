"""Reward side: gradients match finite differences; the RM stays frozen; bad input fails clearly.

Every reward model kind runs in float64 on the policy's own (MiniLM/BERT) vocabulary, so the
gradient is checked in the RM's input-embedding space: along a random direction on the
response positions, <reward_grad, v> equals a central finite difference of the reward,
evaluated by calling the model directly (not through the adapter). Llama's RMSNorm computes
in float32 even in a float64 model, so its reward is only float32-accurate: its difference
step and tolerance are wider (its gradient still agrees to ~1e-5 relative).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from adapters.direction import EmbeddingDirectionModel, embedding_for_vocab
from adapters.reward_models import EncoderSimilarityRM, ModuleRM, SeqClassificationRM, mean_pool
from adapters.tiny import tiny_encoder, tiny_seq_classifier
from credit_core import CreditError
from tests.helpers.adapters import TARGET, central_difference, minilm_tokenizer, text_batch

pytestmark = pytest.mark.usefixtures("single_torch_thread")

F64 = torch.float64


class ToyRM(torch.nn.Module):
    """reward = v . masked-mean(tanh(W e + b)): a small nonlinear user module."""

    def __init__(self, d: int, seed: int = 0) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.lin = torch.nn.Linear(d, d, dtype=F64)
        with torch.no_grad():
            self.lin.weight.normal_(generator=gen)
        self.v = torch.nn.Parameter(torch.randn(d, dtype=F64, generator=gen))

    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        m = attention_mask.to(inputs_embeds.dtype).unsqueeze(2)
        pooled = (torch.tanh(self.lin(inputs_embeds)) * m).sum(1) / m.sum(1)
        return pooled @ self.v


def _bert_classifier() -> tuple[EmbeddingDirectionModel, Callable[..., torch.Tensor]]:
    tok = minilm_tokenizer()
    model = tiny_seq_classifier("bert", len(tok), hidden=16, dtype=F64)
    dm = SeqClassificationRM(model, tok, tok)

    def reward(e: torch.Tensor, x: object) -> torch.Tensor:
        kw = {"attention_mask": x.attention_mask, "token_type_ids": x.token_type_ids}  # type: ignore[attr-defined]
        return model(inputs_embeds=e, **kw).logits[:, 0]

    return dm, reward


def _llama_classifier() -> tuple[EmbeddingDirectionModel, Callable[..., torch.Tensor]]:
    tok = minilm_tokenizer()
    model = tiny_seq_classifier("llama", len(tok), hidden=16, dtype=F64)
    dm = SeqClassificationRM(model, tok, tok)
    assert dm.padding_side == "left"

    def reward(e: torch.Tensor, x: object) -> torch.Tensor:
        kw = {"attention_mask": x.attention_mask, "position_ids": x.position_ids}  # type: ignore[attr-defined]
        return model(inputs_embeds=e, **kw).logits[:, 0]

    return dm, reward


def _encoder_similarity() -> tuple[EmbeddingDirectionModel, Callable[..., torch.Tensor]]:
    tok = minilm_tokenizer()
    model = tiny_encoder(len(tok), hidden=16, dtype=F64)
    dm = EncoderSimilarityRM(model, tok, tok, TARGET)
    enc = tok(TARGET, return_tensors="pt")
    with torch.no_grad():
        target = mean_pool(model(**enc).last_hidden_state, enc["attention_mask"])

    def reward(e: torch.Tensor, x: object) -> torch.Tensor:
        mask = x.attention_mask  # type: ignore[attr-defined]
        h = model(inputs_embeds=e, attention_mask=mask, token_type_ids=x.token_type_ids)  # type: ignore[attr-defined]
        return torch.nn.functional.cosine_similarity(
            mean_pool(h.last_hidden_state, mask), target, dim=1
        )

    return dm, reward


def _module() -> tuple[EmbeddingDirectionModel, Callable[..., torch.Tensor]]:
    tok = minilm_tokenizer()
    table = torch.randn(len(tok), 12, dtype=F64, generator=torch.Generator().manual_seed(1))
    module = ToyRM(12)
    dm = ModuleRM(module, table, policy_vocab_size=len(tok))
    return dm, lambda e, x: module(e, x.attention_mask)


KINDS = {
    "bert_classifier": _bert_classifier,
    "llama_classifier": _llama_classifier,
    "encoder_similarity": _encoder_similarity,
    "module": _module,
}
#: (finite-difference step, relative tolerance) per kind; see the module docstring.
FD_SETTINGS = {"llama_classifier": (1e-4, 1e-3)}


RM = tuple[EmbeddingDirectionModel, Callable[..., torch.Tensor], str]


@pytest.fixture(scope="module", params=sorted(KINDS))
def rm(request: pytest.FixtureRequest) -> RM:
    return (*KINDS[request.param](), request.param)


def test_reward_gradient_matches_central_differences(rm: RM) -> None:
    dm, reward, kind = rm
    h, rtol = FD_SETTINGS.get(kind, (1e-5, 1e-6))
    batch = text_batch(minilm_tokenizer())
    out = dm.score(*batch, with_grad=True)
    assert out.reward_grad is not None and out.reward_grad.dtype == F64
    x = dm.prepare(*batch)
    assert x.policy_index is not None
    e0 = (
        dm.modules[0].get_input_embeddings()(x.inputs.input_ids)
        if not isinstance(dm, ModuleRM)
        else dm.table[x.inputs.input_ids]
    )
    with torch.no_grad():
        torch.testing.assert_close(out.rewards, reward(e0, x.inputs), rtol=0, atol=1e-12)

    response_mask = batch[3].bool()
    assert torch.all(out.reward_grad[~response_mask] == 0)
    gen = torch.Generator().manual_seed(7)
    for _ in range(3):
        v_policy = torch.randn(out.reward_grad.shape, dtype=F64, generator=gen)
        v_policy = v_policy * response_mask.unsqueeze(2)
        v = torch.zeros_like(e0)
        rows = torch.arange(v.shape[0]).unsqueeze(1).expand_as(x.policy_index)
        ok = x.policy_index >= 0
        v[rows[ok], x.policy_index[ok]] = v_policy[ok]
        predicted = (out.reward_grad * v_policy).sum(dim=(1, 2))
        fd = central_difference(lambda e: reward(e, x.inputs), e0, v, h=h)
        torch.testing.assert_close(predicted, fd, rtol=rtol, atol=1e-9)


def test_rewards_equal_the_model_on_its_own_unpadded_input_ids() -> None:
    """Padding, special tokens and positions are right: compare row by row on input_ids."""
    tok = minilm_tokenizer()
    batch = text_batch(tok)
    pid, pm, rid, rm_ = batch
    for family in ("bert", "llama"):
        model = tiny_seq_classifier(family, len(tok), hidden=16, dtype=F64, seed=3)
        rewards = SeqClassificationRM(model, tok, tok).score(*batch, with_grad=False).rewards
        for b in range(pid.shape[0]):
            p, r = pid[b][pm[b].bool()].tolist(), rid[b][rm_[b].bool()].tolist()
            ids = [tok.cls_token_id, *p, tok.sep_token_id, *r, tok.sep_token_id]
            types = [0] * (len(p) + 2) + [1] * (len(r) + 1)
            kwargs = {"token_type_ids": torch.tensor([types])} if family == "bert" else {}
            with torch.no_grad():
                want = model(input_ids=torch.tensor([ids]), **kwargs).logits[0, 0]
            torch.testing.assert_close(rewards[b], want, rtol=0, atol=1e-12, msg=family)


def test_reward_model_stays_frozen_and_in_eval_mode(rm: RM) -> None:
    dm, _, _ = rm
    dm.score(*text_batch(minilm_tokenizer()), with_grad=True)
    for module in dm.modules:
        assert not module.training
        for name, p in module.named_parameters():
            assert p.grad is None, name
            assert not p.requires_grad, name


def test_train_mode_and_inference_mode_are_refused() -> None:
    dm, _ = _module()
    batch = text_batch(minilm_tokenizer())
    dm.modules[0].train()
    with pytest.raises(CreditError, match="train mode"):
        dm.score(*batch, with_grad=False)
    dm.modules[0].eval()
    with torch.inference_mode(), pytest.raises(CreditError, match="inference_mode"):
        dm.score(*batch, with_grad=True)


def test_empty_response_gets_a_reward_and_zero_gradient() -> None:
    dm, _ = _encoder_similarity()
    pid, pm, rid, rm_ = text_batch(minilm_tokenizer())
    rm_[1] = 0
    out = dm.score(pid, pm, rid, rm_, with_grad=True)
    assert torch.isfinite(out.rewards).all()
    assert out.reward_grad is not None
    assert torch.all(out.reward_grad[1] == 0)
    assert out.reward_grad[0].abs().sum() > 0


DOG = 3899  # "dog" in MiniLM's vocabulary


class _Const(torch.nn.Module):
    def __init__(self, fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, e: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.fn(e, mask)


def _module_rm(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], **kw: object) -> ModuleRM:
    V = len(minilm_tokenizer())
    table = torch.randn(V, 4, dtype=F64, generator=torch.Generator().manual_seed(0))
    table[DOG] = 0.0  # sqrt'(0) is infinite
    return ModuleRM(_Const(fn), table, policy_vocab_size=V, **kw)  # type: ignore[arg-type]


def test_bad_reward_model_outputs_are_clear_errors() -> None:
    batch = text_batch(minilm_tokenizer())
    with pytest.raises(CreditError, match=r"reward model output: expected shape \(3,\).*\(3, 1\)"):
        _module_rm(lambda e, m: e.sum(dim=(1, 2)).unsqueeze(1)).score(*batch, with_grad=True)
    with pytest.raises(CreditError, match=r"rewards: .*non-finite rewards in rows \[0, 1, 2\]"):
        _module_rm(lambda e, m: e.sum(dim=(1, 2)) * float("nan")).score(*batch, with_grad=False)


def test_a_non_finite_gradient_is_an_error_or_passed_on_request() -> None:
    batch = text_batch(minilm_tokenizer())  # only response 0 has "dog" (a zero table row)
    assert [DOG in row.tolist() for row in batch[2]] == [True, False, False]

    def sqrt_reward(e: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        return e.abs().sqrt().sum(dim=(1, 2))

    with pytest.raises(CreditError, match=r"reward_grad: non-finite gradient .* rows \[0\]"):
        _module_rm(sqrt_reward).score(*batch, with_grad=True)
    out = _module_rm(sqrt_reward, on_nonfinite_grad="pass").score(*batch, with_grad=True)
    assert out.reward_grad is not None
    assert not torch.isfinite(out.reward_grad[0]).all()
    assert torch.isfinite(out.reward_grad[1:]).all()


def test_mismatched_inputs_are_clear_errors() -> None:
    tok = minilm_tokenizer()
    V = len(tok)
    with pytest.raises(CreditError, match=f"embedding: expected {V} rows"):
        ModuleRM(ToyRM(4), torch.zeros(V - 1, 4, dtype=F64), policy_vocab_size=V)
    with pytest.raises(CreditError, match=f"embedding: expected {V} rows"):  # V from the tokenizer
        ModuleRM(ToyRM(4), torch.zeros(V - 1, 4, dtype=F64), policy_tokenizer=tok)
    dm, _ = _module()
    pid, pm, rid, rm_ = text_batch(tok)
    with pytest.raises(CreditError, match="prompt_mask: expected shape"):
        dm.score(pid, pm[:, 1:], rid, rm_, with_grad=False)
    with pytest.raises(CreditError, match="response_ids: expected shape"):
        dm.score(pid, pm, rid[:2], rm_, with_grad=False)
    holes = rm_.clone()
    holes[2, 0] = 0
    with pytest.raises(CreditError, match=r"right-padded responses .* rows \[2\]"):
        dm.score(pid, pm, rid, holes, with_grad=False)
    big = rid.clone()
    big[0, 0] = V
    with pytest.raises(CreditError, match=f"response_ids: expected ids in \\[0, {V}\\)"):
        dm.score(pid, pm, big, rm_, with_grad=False)
    two_labels = tiny_seq_classifier("bert", V, hidden=16)
    two_labels.config.num_labels = 2
    with pytest.raises(CreditError, match="num_labels=1"):
        SeqClassificationRM(two_labels, tok, tok)


def test_a_narrower_embedding_is_padded_with_zero_rows() -> None:
    E = torch.randn(5, 2)
    padded = embedding_for_vocab(E, 8)
    assert torch.equal(padded[:5], E) and float(padded[5:].abs().sum()) == 0.0
    assert embedding_for_vocab(E, 5) is E
