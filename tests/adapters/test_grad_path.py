"""The curvature-robust reward gradient (``adapters.grad_path``), docs/design.md,
"Curvature-robust direction".

- Path positions: midpoint (1 point) and the midpoint rule (n points).
- At a = 0 the path gradient is the RM's own reward gradient (the sampled point).
- Completeness, a brute-force check of "the gradient is taken on the right path": for a
  quadratic RM the midpoint gradient dotted with the step m1 - E[y] equals R(m1) - R(E[y])
  exactly; for a nonlinear RM the integrated gradient (64 points) does to 1e-4, while the
  sampled-point gradient does not.
- Padding gets 0; bad m1 shapes and empty paths are refused; the wrapper keeps the RM's
  reward and feeds ``datc`` a gradient with which every strategy invariant holds (sign,
  mean, padding).
"""

from __future__ import annotations

import pytest
import torch

from adapters.grad_path import (
    HandedExpectedEmbeddings,
    PathGradientDirection,
    path_alphas,
    path_reward_grad,
    with_grad_path,
)
from adapters.reward_models import ModuleRM
from adapters.scorers import ModelScorer, RewardSignals
from credit_core import CreditBatch, CreditError, get_strategy, policy_stats_from_logits

pytestmark = pytest.mark.usefixtures("single_torch_thread")

F64 = torch.float64
V, d, B, P, R = 11, 4, 3, 2, 5


class QuadraticRM(torch.nn.Module):
    """r = sum_t mask_t ((a . x_t)^2 + b . x_t): its gradient is linear in x."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(1)
        self.a = torch.nn.Parameter(torch.randn(d, dtype=F64, generator=gen))
        self.b = torch.nn.Parameter(torch.randn(d, dtype=F64, generator=gen))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        per = (x @ self.a) ** 2 + x @ self.b
        return (per * mask.to(x.dtype)).sum(dim=1)


class TanhRM(torch.nn.Module):
    """r = v . tanh(W mean_t x_t): nonlinear across positions."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(2)
        self.W = torch.nn.Parameter(torch.randn(d, d, dtype=F64, generator=gen))
        self.v = torch.nn.Parameter(torch.randn(d, dtype=F64, generator=gen))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m = mask.to(x.dtype).unsqueeze(2)
        pooled = (x * m).sum(1) / m.sum(1)
        return torch.tanh(pooled @ self.W.T) @ self.v


def _batch() -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(0, V, (B, P), generator=gen)
    prompt_mask = torch.ones(B, P, dtype=torch.bool)
    response_ids = torch.randint(0, V, (B, R), generator=gen)
    response_mask = torch.arange(R).unsqueeze(0) < torch.tensor([[R], [3], [1]])
    logits = torch.randn(B, R, V, generator=gen, dtype=F64)
    return prompt_ids, prompt_mask, response_ids, response_mask, logits


def _rm(module: torch.nn.Module) -> ModuleRM:
    table = torch.randn(V, d, dtype=F64, generator=torch.Generator().manual_seed(3))
    return ModuleRM(module, table, policy_vocab_size=V, include_prompt=False)


def _m1(rm: ModuleRM, logits: torch.Tensor) -> torch.Tensor:
    return torch.softmax(logits, dim=2) @ rm.reward_embedding


def _reward_at(
    rm: ModuleRM, response_ids: torch.Tensor, mask: torch.Tensor, x: torch.Tensor
) -> torch.Tensor:
    """R with the response inputs replaced by x (B, R, d) at valid positions."""
    base = rm.reward_embedding[response_ids]
    xs = torch.where(mask.unsqueeze(2), x, base)
    return rm.module(xs, mask)


def test_path_positions() -> None:
    assert path_alphas(1) == [0.5]
    assert path_alphas(4) == [0.125, 0.375, 0.625, 0.875]
    for bad in (0, -1, True, 1.0):
        with pytest.raises(CreditError, match="points: expected an int >= 1"):
            path_alphas(bad)  # type: ignore[arg-type]


def test_at_the_sampled_point_it_is_the_rms_own_gradient() -> None:
    rm = _rm(TanhRM())
    p_ids, p_mask, r_ids, r_mask, logits = _batch()
    own = rm.score(p_ids, p_mask, r_ids, r_mask, with_grad=True).reward_grad
    path = path_reward_grad(rm, p_ids, p_mask, r_ids, r_mask, _m1(rm, logits), [0.0])
    assert own is not None
    torch.testing.assert_close(path, own, rtol=0, atol=1e-12)
    assert bool((path[~r_mask] == 0).all())


def test_midpoint_is_exact_for_a_quadratic_rm() -> None:
    rm = _rm(QuadraticRM())
    p_ids, p_mask, r_ids, r_mask, logits = _batch()
    m1 = _m1(rm, logits)
    g = path_reward_grad(rm, p_ids, p_mask, r_ids, r_mask, m1, path_alphas(1))
    step = torch.where(r_mask.unsqueeze(2), m1 - rm.reward_embedding[r_ids], 0.0)
    predicted = (g * step).sum(dim=(1, 2))
    exact = _reward_at(rm, r_ids, r_mask, m1) - _reward_at(
        rm, r_ids, r_mask, rm.reward_embedding[r_ids]
    )
    torch.testing.assert_close(predicted, exact, rtol=0, atol=1e-10)
    sampled = rm.score(p_ids, p_mask, r_ids, r_mask, with_grad=True).reward_grad
    assert sampled is not None
    assert float(((sampled * step).sum(dim=(1, 2)) - exact).abs().max()) > 1e-3


def test_integrated_gradient_is_complete_for_a_nonlinear_rm() -> None:
    rm = _rm(TanhRM())
    p_ids, p_mask, r_ids, r_mask, logits = _batch()
    m1 = _m1(rm, logits * 0.3)
    alphas = path_alphas(64)
    g = path_reward_grad(rm, p_ids, p_mask, r_ids, r_mask, m1, alphas)
    step = torch.where(r_mask.unsqueeze(2), m1 - rm.reward_embedding[r_ids], 0.0)
    exact = _reward_at(rm, r_ids, r_mask, m1) - _reward_at(
        rm, r_ids, r_mask, rm.reward_embedding[r_ids]
    )
    torch.testing.assert_close((g * step).sum(dim=(1, 2)), exact, rtol=0, atol=1e-4)


def test_wrapper_keeps_the_reward_and_datc_invariants_hold() -> None:
    rm = _rm(TanhRM())
    p_ids, p_mask, r_ids, r_mask, logits = _batch()
    m1 = _m1(rm, logits)

    def expected(*_: torch.Tensor) -> torch.Tensor:
        return m1

    signals = with_grad_path(RewardSignals(ModelScorer(rm), rm), 2, expected)
    assert isinstance(signals.direction_model, PathGradientDirection)
    assert (
        isinstance(signals.scorer, ModelScorer) and signals.scorer.model is signals.direction_model
    )
    wrapped = PathGradientDirection(rm, expected, 2)
    out = wrapped.score(p_ids, p_mask, r_ids, r_mask, with_grad=True)
    torch.testing.assert_close(
        out.rewards, rm.score(p_ids, p_mask, r_ids, r_mask, with_grad=False).rewards
    )
    assert out.reward_grad is not None and bool((out.reward_grad[~r_mask] == 0).all())
    advantages = torch.tensor([1.5, -0.7, 0.4], dtype=F64)
    stats = policy_stats_from_logits(logits, r_ids, rm.reward_embedding)
    batch = CreditBatch(advantages, r_mask, r_ids, reward_grad=out.reward_grad, policy_stats=stats)
    adv = get_strategy({"name": "datc", "beta": 2.0, "lam": 0.5}).assign(batch).double()
    n = r_mask.sum(dim=1)
    torch.testing.assert_close((adv * r_mask).sum(dim=1) / n, advantages, rtol=0, atol=1e-5)
    assert bool((adv[~r_mask] == 0).all())
    assert bool(((adv * advantages.unsqueeze(1))[r_mask] > 0).all())


def test_bad_inputs_are_refused() -> None:
    rm = _rm(TanhRM())
    p_ids, p_mask, r_ids, r_mask, logits = _batch()
    with pytest.raises(CreditError, match="m1: expected shape"):
        path_reward_grad(rm, p_ids, p_mask, r_ids, r_mask, _m1(rm, logits)[:, :2], [0.5])
    with pytest.raises(CreditError, match="at least one"):
        path_reward_grad(rm, p_ids, p_mask, r_ids, r_mask, _m1(rm, logits), [])
    for direction in (None, object()):  # no direction model; one without input embeddings
        with pytest.raises(CreditError, match="must read input embeddings"):
            PathGradientDirection(direction, HandedExpectedEmbeddings(), 1)  # type: ignore[arg-type]
