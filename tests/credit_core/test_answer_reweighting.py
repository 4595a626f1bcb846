"""OAR-G's bi-level weights (docs/design.md, "Answer-gradient reweighting (OAR-G)") against a
brute-force per-token loop written from the authors' description (numpy's quantile), the
contract (sign and per-response mean of A kept), and the refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from credit_core import CreditConfig, CreditError, CreditSignals, assign_credit, get_strategy
from credit_core.answer_reweighting import reasoning_mask


def _brute_force(
    s: torch.Tensor,
    mask: torch.Tensor,
    answer: torch.Tensor,
    quantile: float,
    beta: float,
    floor: float,
) -> torch.Tensor:
    B, T = mask.shape
    out = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        answers = [t for t in range(T) if answer[b, t]]
        first = answers[0] if answers else -1
        idx = [t for t in range(T) if mask[b, t] and t < first]
        for t in range(T):
            if mask[b, t]:
                out[b, t] = 1.0
        if not idx:
            continue
        u = np.log1p(np.array([float(s[b, t]) for t in idx]))
        lo, hi = u.min(), u.max()
        x = (u - lo) / (hi - lo if hi > lo else 1.0)
        tau = float(np.quantile(x, quantile))
        w = []
        for xi in x:
            if xi < tau:
                w.append(max(xi / tau, floor))
            else:
                w.append(1.0 + beta * ((xi - tau) / (1.0 - tau) if tau < 1.0 else 0.0))
        total = sum(w)
        for t, wi in zip(idx, w, strict=True):
            out[b, t] = wi * len(idx) / total
    return out


def _case(seed: int, B: int = 5, T: int = 9) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    start = (torch.rand(B, generator=gen) * lengths).long()
    positions = torch.arange(T).unsqueeze(0)
    answer = mask & (positions >= start.unsqueeze(1)) & (torch.rand(B, 1, generator=gen) < 0.85)
    s = torch.rand(B, T, generator=gen, dtype=torch.float64) ** 3 * 5
    s = torch.where(reasoning_mask(mask, answer), s, 0.0)
    adv = torch.randn(B, generator=gen, dtype=torch.float64)
    return s, mask, answer, adv


def _assign(
    s: torch.Tensor, mask: torch.Tensor, answer: torch.Tensor, adv: torch.Tensor, **params: float
) -> tuple[torch.Tensor, object]:
    strategy = get_strategy(CreditConfig.parse({"name": "oar_g", **params}))
    ids = torch.zeros(mask.shape, dtype=torch.long)
    result = assign_credit(
        strategy, adv, mask, ids, CreditSignals(answer_saliency=s), answer_mask=answer
    )
    return result.token_advantages, result.diagnostics


@pytest.mark.parametrize(
    "params",
    [{}, {"quantile": 0.2, "beta": 2.5}, {"quantile": 0.9, "floor": 0.3}, {"quantile": 1.0}],
)
@pytest.mark.parametrize("seed", range(4))
def test_weights_match_a_per_token_loop(params: dict[str, float], seed: int) -> None:
    s, mask, answer, adv = _case(seed)
    full = {"quantile": 0.5, "beta": 1.0, "floor": 0.1, **params}
    expected = _brute_force(s, mask, answer, **full) * adv.unsqueeze(1)
    got, _ = _assign(s, mask, answer, adv, **params)
    torch.testing.assert_close(got, expected.float(), rtol=1e-5, atol=1e-6)


def test_the_reasoning_tokens_are_the_valid_ones_before_the_first_answer_token() -> None:
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]]).bool()
    answer = torch.tensor([[0, 0, 0, 1, 0, 0], [0, 0, 0, 0, 0, 0], [0, 1, 0, 1, 0, 0]]).bool()
    expected = torch.tensor([[1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]]).bool()
    assert torch.equal(reasoning_mask(mask, answer), expected)


def test_a_response_without_answer_or_reasoning_keeps_the_response_advantage() -> None:
    mask = torch.ones(3, 4, dtype=torch.bool)
    answer = torch.tensor([[0, 0, 1, 1], [0, 0, 0, 0], [1, 1, 0, 0]]).bool()
    s = torch.tensor([[0.5, 2.0, 0.0, 0.0], [0.0] * 4, [0.0] * 4])
    adv = torch.tensor([2.0, -1.0, 0.5])
    got, diag = _assign(s, mask, answer, adv)
    assert torch.equal(got[1], torch.full((4,), -1.0)) and torch.equal(
        got[2], torch.full((4,), 0.5)
    )
    assert torch.equal(got[0, 2:], torch.full((2,), 2.0))  # the answer span: w = 1
    assert got[0, 1] > 2.0 > got[0, 0] > 0  # the reasoning tokens: reweighted
    assert diag.uniform_fallbacks == 2  # type: ignore[attr-defined]


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    quantile=st.floats(0.0, 1.0),
    beta=st.floats(0.0, 10.0),
    floor=st.floats(0.01, 1.0),
    scale=st.sampled_from([1e-12, 1e-3, 1.0, 1e6]),
)
def test_advantages_keep_sign_and_per_response_mean(
    seed: int, quantile: float, beta: float, floor: float, scale: float
) -> None:
    s, mask, answer, adv = _case(seed, B=6, T=12)
    got, _ = _assign(s * scale, mask, answer, adv, quantile=quantile, beta=beta, floor=floor)
    got64 = got.double()
    n = mask.sum(dim=1).double()
    torch.testing.assert_close(got64.sum(dim=1) / n, adv, rtol=1e-5, atol=1e-6)
    same_sign = torch.where(mask, torch.sign(got64) == torch.sign(adv).unsqueeze(1), True)
    assert bool(same_sign.all())
    assert bool((got64[~mask] == 0).all())
    assert all(math.isfinite(v) for v in got64.flatten().tolist())


def test_a_strategy_needing_the_answer_span_is_refused_without_one() -> None:
    s, mask, answer, adv = _case(0)
    strategy = get_strategy(CreditConfig(name="oar_g"))
    ids = torch.zeros(mask.shape, dtype=torch.long)
    with pytest.raises(
        CreditError,
        match=r"reads each response's answer span, but "
        r"CreditBatch.answer_mask is None",
    ):
        assign_credit(strategy, adv, mask, ids, CreditSignals(answer_saliency=s))
    with pytest.raises(CreditError, match=r"requires signal 'answer_saliency'"):
        assign_credit(strategy, adv, mask, ids, answer_mask=answer)
    outside = answer.clone()
    outside[0, -1] = True
    mask[0, -1] = False
    with pytest.raises(CreditError, match=r"CreditBatch.answer_mask: expected answer tokens"):
        assign_credit(
            strategy, adv, mask, ids, CreditSignals(answer_saliency=s), answer_mask=outside
        )


@pytest.mark.parametrize("bad", [float("nan"), -1.0])
def test_a_non_finite_or_negative_saliency_is_refused(bad: float) -> None:
    mask = torch.ones(1, 4, dtype=torch.bool)
    answer = torch.tensor([[0, 0, 0, 1]]).bool()
    s = torch.tensor([[0.1, bad, 0.2, 0.0]])
    with pytest.raises(CreditError, match=r"answer_saliency: expected finite values >= 0"):
        _assign(s, mask, answer, torch.tensor([1.0]))
