"""The curvature-robust reward gradient (``adapters.grad_path``), docs/design.md,
"Curvature-robust direction".

- Path positions: midpoint (1 point) and the midpoint rule (n points).
- At a = 0 the path gradient is the RM's own reward gradient (the sampled point).
- Completeness, a brute-force check of "the gradient is taken on the right path": for a
  quadratic RM the midpoint gradient dotted with the step m1 - E[y] equals R(m1) - R(E[y])
  exactly; for a nonlinear RM the integrated gradient (64 points) does to 1e-4, while the
  sampled-point gradient does not.
- A bf16 reward model (a tiny HF classifier, through ``with_grad_path`` as datc_mid and
  datc_ig use it) gives the float32 RM's path gradient to bf16 precision, in float32; in
  float32 the result is bit for bit the mean of the RM's own gradients along the path.
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
from adapters.reward_models import ModuleRM, SeqClassificationRM
from adapters.scorers import ModelScorer, RewardSignals
from adapters.tiny import tiny_seq_classifier
from credit_core import CreditBatch, CreditError, get_strategy, policy_stats_from_logits
from tests.helpers.adapters import bpe_tokenizer, text_batch

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


def _hf_path_signals(
    dtype: torch.dtype, points: int
) -> tuple[RewardSignals, tuple[torch.Tensor, ...], torch.Tensor]:
    """A tiny Llama sequence classifier in ``dtype`` (the same weights in every dtype), read
    through ``SeqClassificationRM`` on the policy's own token ids and wrapped for the path
    gradient with ``points`` points exactly as a backend wraps it for datc_mid/datc_ig
    (``with_grad_path``), with a text rollout batch and its m1."""
    tokenizer = bpe_tokenizer()
    model = tiny_seq_classifier("llama", len(tokenizer), seed=4).to(dtype)
    rm = SeqClassificationRM(model, tokenizer, policy_vocab_size=len(tokenizer))
    rollout = text_batch(tokenizer)
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(*rollout[2].shape, len(tokenizer), generator=gen)
    m1 = torch.softmax(logits, dim=2) @ rm.reward_embedding.float()

    def expected(*_: torch.Tensor) -> torch.Tensor:
        return m1

    return with_grad_path(RewardSignals(ModelScorer(rm), rm), points, expected), rollout, m1


@pytest.mark.parametrize("points", [1, 3], ids=["datc_mid", "datc_ig"])
def test_a_bf16_reward_model_gives_the_fp32_path_gradient_to_bf16_precision(points: int) -> None:
    """A half-precision RM (TRL's under a bf16 DeepSpeed config, ``direction.dtype:
    bfloat16``) takes the path gradient: the path's points are fed to it in its own dtype
    (a float32 leaf would fail its first matmul on dtype, on the CPU as on a GPU), the
    gradient is accumulated and returned in float32, and it is the float32 RM's to bf16
    precision (relative norm error < 3%, cosine > 0.999); 0 at padding."""
    signals, rollout, _ = _hf_path_signals(torch.bfloat16, points)
    reference, _, _ = _hf_path_signals(torch.float32, points)
    assert signals.direction_model is not None and reference.direction_model is not None
    got = signals.direction_model.score(*rollout, with_grad=True).reward_grad
    want = reference.direction_model.score(*rollout, with_grad=True).reward_grad
    assert got is not None and want is not None
    assert got.dtype == torch.float32
    mask = rollout[3].bool()
    assert bool((got[~mask] == 0).all())
    error = float((got - want).norm() / want.norm())
    cosine = float(torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0))
    assert error < 0.03 and cosine > 0.999, (error, cosine)


def test_a_float32_reward_model_path_gradient_is_the_mean_of_its_own_gradients() -> None:
    """In float32 the path gradient is, bit for bit, the mean over the path's points of the
    RM's own input gradient at x(a) = E[y] + a (m1 - E[y]) (response positions moved,
    prompt and special tokens not), accumulated in float32."""
    signals, rollout, m1 = _hf_path_signals(torch.float32, 3)
    wrapped = signals.direction_model
    assert isinstance(wrapped, PathGradientDirection)
    rm = wrapped.inner
    got = wrapped.score(*rollout, with_grad=True).reward_grad
    prepared = rm.prepare(*rollout)
    index = prepared.policy_index
    assert index is not None and got is not None
    base = rm.table[prepared.inputs.input_ids]
    rows, cols = torch.nonzero(index >= 0, as_tuple=True)
    step = torch.zeros_like(base)
    step[rows, index[rows, cols]] = m1[rows, cols] - base[rows, index[rows, cols]]
    total = torch.zeros_like(base)
    for a in path_alphas(3):
        x = (base + a * step).requires_grad_(True)
        (g,) = torch.autograd.grad(rm.reward_from_embeds(x, prepared.inputs).sum(), x)
        total += g
    want = torch.zeros_like(got)
    want[rows, cols] = total[rows, index[rows, cols]] / 3
    assert torch.equal(got, want)
