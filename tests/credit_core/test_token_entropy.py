"""Streamed token entropy == the entropy of the full softmax computed directly (from hidden
states and from materialized logits); the old policy's log-probs and entropy from one
streamed pass == both computed from the full softmax."""

from __future__ import annotations

import math

import pytest
import torch

from credit_core import CreditError, streamed_logprobs_and_entropy, token_entropy
from credit_core.token_entropy import token_entropy_from_logits

pytestmark = pytest.mark.usefixtures("single_torch_thread")


def _full_softmax_entropy(logits: torch.Tensor, tau: float) -> torch.Tensor:
    """-sum_v p log p with the whole (B, T, V) softmax materialized, in float64."""
    logp = torch.log_softmax(logits.double() / tau, dim=-1)
    return -(logp.exp() * logp).nan_to_num().sum(-1)


@pytest.mark.parametrize("tau", [1.0, 0.6])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(("chunk", "tile_elements"), [(4096, 1 << 21), (7, 10), (16, 1), (75, 40)])
def test_token_entropy_matches_the_full_softmax_entropy(
    tau: float, bias: bool, chunk: int, tile_elements: int
) -> None:
    gen = torch.Generator().manual_seed(3)
    B, T, H, V = 3, 5, 16, 75
    hidden = torch.randn(B, T, H, generator=gen, dtype=torch.float64) * 3
    weight = torch.randn(V, H, generator=gen, dtype=torch.float64)
    b = torch.randn(V, generator=gen, dtype=torch.float64) if bias else None
    logits = hidden @ weight.T + (b if b is not None else 0.0)
    H_t = token_entropy(
        hidden,
        weight,
        temperature=tau,
        lm_head_bias=b,
        chunk_size=chunk,
        tile_elements=tile_elements,
    )
    assert H_t.shape == (B, T) and H_t.dtype == torch.float64
    torch.testing.assert_close(H_t, _full_softmax_entropy(logits, tau), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("tau", [1.0, 0.6])
@pytest.mark.parametrize(("chunk", "tile_elements"), [(4096, 1 << 21), (7, 10), (16, 1)])
def test_token_entropy_from_logits_matches_the_full_softmax_entropy(
    tau: float, chunk: int, tile_elements: int
) -> None:
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(3, 5, 75, generator=gen, dtype=torch.float64) * 4
    logits[0, 1, 3] = float("-inf")  # a masked entry contributes 0
    H_t = token_entropy_from_logits(
        logits, temperature=tau, chunk_size=chunk, tile_elements=tile_elements
    )
    assert H_t.shape == (3, 5) and H_t.dtype == torch.float64
    torch.testing.assert_close(H_t, _full_softmax_entropy(logits, tau), rtol=1e-10, atol=1e-10)
    as_float = token_entropy_from_logits(logits.float().requires_grad_(), chunk_size=chunk)
    assert as_float.dtype == torch.float32 and not as_float.requires_grad
    torch.testing.assert_close(as_float, _full_softmax_entropy(logits, 1.0).float())
    with pytest.raises(CreditError, match="logits: expected shape"):
        token_entropy_from_logits(logits[0])
    bad = logits.clone()
    bad[2, 4, 70] = float("nan")
    with pytest.raises(CreditError, match="vocabulary 64:75: a logit is NaN"):
        token_entropy_from_logits(bad, chunk_size=16)


@pytest.mark.parametrize(("chunk", "tile_elements"), [(4096, 1 << 21), (7, 10), (16, 1)])
def test_logprobs_and_entropy_from_one_pass_match_the_full_softmax(
    chunk: int, tile_elements: int
) -> None:
    gen = torch.Generator().manual_seed(4)
    B, T, H, V, tau = 3, 5, 16, 75, 0.7
    hidden = torch.randn(B, T, H, generator=gen, dtype=torch.float64) * 3
    weight = torch.randn(V, H, generator=gen, dtype=torch.float64, requires_grad=True)
    b = torch.randn(V, generator=gen, dtype=torch.float64)
    ids = torch.randint(0, V, (B, T), generator=gen)
    logits = (hidden @ weight.T + b).detach()
    logp, H_t = streamed_logprobs_and_entropy(
        hidden,
        weight,
        ids,
        temperature=tau,
        lm_head_bias=b,
        chunk_size=chunk,
        tile_elements=tile_elements,
    )
    full = torch.log_softmax(logits / tau, dim=-1)
    torch.testing.assert_close(logp, full.gather(2, ids.unsqueeze(2)).squeeze(2))
    torch.testing.assert_close(H_t, _full_softmax_entropy(logits, tau), rtol=1e-10, atol=1e-10)
    assert not logp.requires_grad and not H_t.requires_grad
    with pytest.raises(CreditError, match="token_ids: expected values in"):
        streamed_logprobs_and_entropy(hidden, weight, ids + V)


def test_token_entropy_float32_and_no_grad() -> None:
    gen = torch.Generator().manual_seed(4)
    hidden = torch.randn(2, 4, 8, generator=gen, requires_grad=True)
    weight = torch.randn(50, 8, generator=gen)
    H_t = token_entropy(hidden, weight, chunk_size=16)
    assert H_t.dtype == torch.float32 and not H_t.requires_grad
    expected = _full_softmax_entropy(hidden.detach() @ weight.T, 1.0).float()
    torch.testing.assert_close(H_t, expected, rtol=2e-5, atol=2e-6)


def test_token_entropy_of_masked_entries_and_extremes() -> None:
    """A -inf (masked) logit contributes 0; one dominant logit gives H = 0; equal logits
    give log V."""
    V = 6
    weight = torch.eye(V, dtype=torch.float64)
    hidden = torch.zeros(1, 3, V, dtype=torch.float64)
    hidden[0, 1, 2] = 1e4
    bias = torch.zeros(V, dtype=torch.float64)
    bias[0] = float("-inf")
    H_t = token_entropy(hidden, weight, lm_head_bias=bias, chunk_size=4)
    expected = torch.tensor([[math.log(V - 1), 0.0, math.log(V - 1)]], dtype=torch.float64)
    torch.testing.assert_close(H_t, expected, rtol=1e-12, atol=1e-12)


def test_token_entropy_names_the_tile_of_a_nan_logit() -> None:
    weight = torch.randn(10, 4)
    weight[7, 0] = float("nan")
    with pytest.raises(CreditError, match="vocabulary 4:8: a logit is NaN"):
        token_entropy(torch.randn(1, 2, 4), weight, chunk_size=4)
