"""P2T's token reward against brute force (docs/design.md, "Gradient x input attribution (P2T)").

r_t = (e_t - e_null) . g_t is the first-order Taylor estimate of Delta_t = R(x) - R(x with
e_t := e_null). Brute force: for every valid response token, one more reward forward with that
token's input embedding replaced by e_null (n forwards for n tokens), calling the model on
the embeddings directly (not through the gradient). The gradient is the library's own
(``EmbeddingDirectionModel.score``), so the test covers the signal as backends compute it.

- An RM linear in its input embeddings: r_t = Delta_t to float64 rounding, for every null.
- A nonlinear RM (tanh of a pooled embedding plus per-token tanh features, with biases so
  that the curvature at 0 is not zero): the error is the Taylor remainder, O(||e_t -
  e_null||^2). Scaling the embedding table (hence e_t - e_null) by s = 0.004, 0.002, 0.001,
  0.0005, the measured max |r - Delta| falls by 3.84x, 3.92x, 3.96x per halving (accepted:
  3.7-4.1; the cubic term fades as s shrinks), and at s = 0.0005 it is 0.23% of max |Delta|
  (accepted: < 0.3%): the relative error is O(s). At s = 0.2 it was 1.5x max |Delta| on this
  model (tanh saturates): the estimate is only as good as the RM is locally linear.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from adapters.direction import EmbeddingDirectionModel
from adapters.reward_models import ModuleRM
from credit_core import CreditError
from credit_core.attribution import NULL_EMBEDDINGS
from tests.helpers.adapters import minilm_tokenizer, text_batch

pytestmark = pytest.mark.usefixtures("single_torch_thread")

F64 = torch.float64
D = 8


class LinearRM(torch.nn.Module):
    """R = sum_l mask_l W_l . x_l: linear in the input embeddings x."""

    def __init__(self) -> None:
        super().__init__()
        self.W = torch.nn.Parameter(
            torch.randn(64, D, dtype=F64, generator=torch.Generator().manual_seed(3))
        )

    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        L = inputs_embeds.shape[1]
        m = attention_mask.to(F64).unsqueeze(2)
        return (inputs_embeds * self.W[:L] * m).sum(dim=(1, 2))


class CurvedRM(torch.nn.Module):
    """R = v . tanh(A mean_l x_l + b) + sum_l mask_l u . tanh(C x_l + c): tokens interact;
    the biases put curvature at x = 0 (tanh'' vanishes only at 0)."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(4)
        self.A, self.C = (
            torch.nn.Parameter(torch.randn(D, D, dtype=F64, generator=gen)) for _ in "AC"
        )
        self.b, self.c, self.u, self.v = (
            torch.nn.Parameter(torch.randn(D, dtype=F64, generator=gen)) for _ in "bcuv"
        )

    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        m = attention_mask.to(F64).unsqueeze(2)
        pooled = (inputs_embeds * m).sum(1) / m.sum(1)
        per_token = (torch.tanh(inputs_embeds @ self.C.T + self.c) * m).sum(1)
        return torch.tanh(pooled @ self.A.T + self.b) @ self.v + per_token @ self.u


def _rm(module: torch.nn.Module, scale: float = 1.0) -> EmbeddingDirectionModel:
    """``module`` over a random table on MiniLM's vocabulary (pad [PAD], unk [UNK])."""
    tok = minilm_tokenizer()
    table = scale * torch.randn(len(tok), D, dtype=F64, generator=torch.Generator().manual_seed(5))
    return ModuleRM(module, table, tokenizer=tok, policy_tokenizer=tok)


def _batch() -> tuple[torch.Tensor, ...]:
    return text_batch(minilm_tokenizer())


def brute_force(dm: EmbeddingDirectionModel, null: torch.Tensor) -> torch.Tensor:
    """Delta (B, R): R(x) - R(x with the embedding of response token t set to ``null``), one
    forward per valid response token; 0 at padding."""
    prompt_ids, prompt_mask, response_ids, response_mask = _batch()
    prepared = dm.prepare(prompt_ids, prompt_mask, response_ids, response_mask)
    assert prepared.policy_index is not None  # the fast path: one RM position per token
    inputs = prepared.inputs
    x = dm.table[inputs.input_ids]
    out = torch.zeros(response_ids.shape, dtype=F64)
    with torch.no_grad():
        base = dm.reward_from_embeds(x, inputs)
        for b, t in torch.nonzero(response_mask.bool()).tolist():
            swapped = x.clone()
            swapped[b, int(prepared.policy_index[b, t])] = null
            out[b, t] = base[b] - dm.reward_from_embeds(swapped, inputs)[b]
    return out


def taylor(dm: EmbeddingDirectionModel, null: str) -> torch.Tensor:
    """r (B, R) as a backend computes it: the library's gradient, then ``attribution``."""
    prompt_ids, prompt_mask, response_ids, response_mask = _batch()
    out = dm.score(prompt_ids, prompt_mask, response_ids, response_mask, with_grad=True)
    assert out.reward_grad is not None
    return dm.attribution(out.reward_grad, response_ids, response_mask, null)


@pytest.mark.parametrize("null", NULL_EMBEDDINGS)
def test_the_attribution_is_exact_for_a_reward_model_linear_in_its_embeddings(null: str) -> None:
    dm = _rm(LinearRM())
    e_null = dm.null_embedding(null)
    expected = brute_force(dm, e_null)
    assert bool((expected != 0).any())
    torch.testing.assert_close(taylor(dm, null), expected, atol=1e-12, rtol=1e-10)


def test_each_null_is_the_embedding_it_names() -> None:
    tok = minilm_tokenizer()
    dm = _rm(LinearRM())
    assert torch.equal(dm.null_embedding("pad"), dm.table[tok.pad_token_id])
    assert torch.equal(dm.null_embedding("unk"), dm.table[tok.unk_token_id])
    assert torch.equal(dm.null_embedding("zero"), torch.zeros(D, dtype=F64))
    assert tok.pad_token_id != tok.unk_token_id


def _max_error(scale: float) -> tuple[float, float]:
    dm = _rm(CurvedRM(), scale)
    exact = brute_force(dm, dm.null_embedding("pad"))
    return float((taylor(dm, "pad") - exact).abs().max()), float(exact.abs().max())


def test_for_a_nonlinear_reward_model_the_error_is_the_quadratic_taylor_remainder() -> None:
    scales = (0.004, 0.002, 0.001, 0.0005)
    errors = [_max_error(s) for s in scales]
    for (coarse, _), (fine, _) in itertools.pairwise(errors):
        assert 3.7 < coarse / fine < 4.1, errors
    err, size = errors[-1]
    assert err < 0.003 * size, errors


def test_unk_without_an_unknown_token_is_refused_naming_the_alternatives() -> None:
    V = 10
    table = torch.randn(V, D, dtype=F64)
    dm = ModuleRM(LinearRM(), table, policy_vocab_size=V)  # reads policy ids: no tokenizer
    with pytest.raises(CreditError, match=r"null: 'unk' .* use null: pad or zero"):
        dm.null_embedding("unk")
    with pytest.raises(CreditError, match=r"null: expected one of \['pad', 'unk', 'zero'\]"):
        dm.null_embedding("eos")
    assert torch.equal(dm.null_embedding("pad"), table[0])  # the id ModuleRM pads with
