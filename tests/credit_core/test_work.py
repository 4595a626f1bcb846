"""The closed form of W equals autograd on the soft relaxation.

docs/design.md, "DATC's score: work".

For one position t with policy logits zeta_t (the logits the sampling distribution is the
softmax of), p_t = softmax(zeta_t), reward embedding table E (V, d) and RM input gradient
g_t (d,), the soft relaxation of the reward is

    R(zeta) = sum_t g_t . (softmax(zeta_t)^T E)

and W_t = < dR/dzeta_t , d_t > with d_t = sign(A) (e_{y_t} - p_t).

Temperature: ``policy_stats(..., temperature=tau)`` describes p_t = softmax(z_t / tau), so
the closed form is W in the coordinates zeta = z / tau of the tempered logits. In the raw
logits z the same quantity reads W = tau^2 < dR/dz_t , sign(A) (e_y - p_t) / tau >, because
dzeta/dz = 1/tau and GRPO's gradient of log p_t[y] w.r.t. z_t is (e_y - p_t) / tau. Both
readings are checked. Everything is float64 and must agree to 1e-10.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from credit_core import policy_stats, policy_stats_from_logits, token_work

pytestmark = pytest.mark.usefixtures("single_torch_thread")

TOL = 1e-10


def _problem(
    seed: int, B: int, T: int, V: int, d: int, H: int = 5, logit_scale: float = 3.0
) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    hidden = torch.randn(B, T, H, generator=gen, dtype=f64)
    weight = torch.randn(V, H, generator=gen, dtype=f64) * logit_scale / H**0.5
    bias = torch.randn(V, generator=gen, dtype=f64)
    return {
        "hidden": hidden,
        "weight": weight,
        "bias": bias,
        "logits": hidden @ weight.T + bias,
        "E": torch.randn(V, d, generator=gen, dtype=f64),
        "g": torch.randn(B, T, d, generator=gen, dtype=f64),
        "y": torch.randint(0, V, (B, T), generator=gen),
        # Positive, negative and zero advantages (sign(0) = 0 gives W = 0).
        "A": torch.tensor([1.7, -0.4, 0.0, 2.5, -3.0], dtype=f64).repeat(B)[:B],
    }


def _autograd_work(
    logits: torch.Tensor,
    E: torch.Tensor,
    g: torch.Tensor,
    y: torch.Tensor,
    A: torch.Tensor | None,
    temperature: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """W by autograd, in tempered coordinates zeta = z / tau and in raw logits z."""
    sign = torch.ones_like(g[..., 0]) if A is None else torch.sign(A)[:, None].expand_as(y)

    zeta = (logits / temperature).detach().requires_grad_(True)
    p = torch.softmax(zeta, dim=-1)
    R = (g * (p @ E)).sum()
    (grad_zeta,) = torch.autograd.grad(R, zeta)
    onehot = torch.nn.functional.one_hot(y, logits.shape[-1]).to(logits.dtype)
    direction = sign[..., None] * (onehot - p.detach())
    w_zeta = (grad_zeta * direction).sum(-1)

    z = logits.detach().requires_grad_(True)
    p_z = torch.softmax(z / temperature, dim=-1)
    (grad_z,) = torch.autograd.grad((g * (p_z @ E)).sum(), z)
    w_z = temperature**2 * (grad_z * direction / temperature).sum(-1)
    return w_zeta, w_z


def _check(
    prob: dict[str, torch.Tensor], temperature: float, chunk_size: int, tile_elements: int
) -> None:
    E, g, y, A = prob["E"], prob["g"], prob["y"], prob["A"]
    from_logits = policy_stats_from_logits(
        prob["logits"],
        y,
        E,
        temperature=temperature,
        chunk_size=chunk_size,
        tile_elements=tile_elements,
    )
    from_hidden = policy_stats(
        prob["hidden"],
        prob["weight"],
        y,
        E,
        temperature=temperature,
        chunk_size=chunk_size,
        lm_head_bias=prob["bias"],
        tile_elements=tile_elements,
    )
    for advantages in (A, None):  # None: datc_nosign's W without the sign(A) factor
        ref_zeta, ref_z = _autograd_work(prob["logits"], E, g, y, advantages, temperature)
        torch.testing.assert_close(ref_z, ref_zeta, rtol=0, atol=TOL)
        for stats in (from_logits, from_hidden):
            assert stats.m1.dtype == torch.float64
            work = token_work(stats, g, advantages)
            assert work.dtype == torch.float64 and work.shape == y.shape
            torch.testing.assert_close(work, ref_zeta, rtol=0, atol=TOL)


@pytest.mark.parametrize(
    ("V", "chunk_size", "tile_elements"),
    [
        (37, 8, 1 << 22),  # V not divisible by the chunk
        (37, 1, 1 << 22),  # one vocabulary entry per chunk
        (37, 1, 3),  # ... and one row per tile
        (37, 64, 1 << 22),  # chunk wider than V
        (37, 37, 40),  # one chunk, row blocks of one
        (64, 16, 48),  # V divisible, three rows per tile
    ],
)
@pytest.mark.parametrize("temperature", [1.0, 0.6, 2.3])
def test_closed_form_matches_autograd(
    V: int, chunk_size: int, tile_elements: int, temperature: float
) -> None:
    _check(
        _problem(seed=V + chunk_size, B=3, T=4, V=V, d=6), temperature, chunk_size, tile_elements
    )


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    B=st.integers(1, 3),
    T=st.integers(1, 5),
    V=st.integers(1, 40),
    d=st.integers(1, 6),
    chunk_size=st.integers(1, 45),
    tile_elements=st.sampled_from([1, 7, 64, 1 << 22]),
    temperature=st.sampled_from([0.3, 1.0, 1.7]),
    logit_scale=st.sampled_from([0.1, 3.0, 40.0]),
)
def test_closed_form_matches_autograd_random_shapes(
    seed: int,
    B: int,
    T: int,
    V: int,
    d: int,
    chunk_size: int,
    tile_elements: int,
    temperature: float,
    logit_scale: float,
) -> None:
    prob = _problem(seed, B, T, V, d, logit_scale=logit_scale)
    _check(prob, temperature, chunk_size, tile_elements)


def test_work_sign_follows_the_advantage() -> None:
    prob = _problem(seed=3, B=2, T=6, V=11, d=4)
    stats = policy_stats_from_logits(prob["logits"], prob["y"], prob["E"], chunk_size=4)
    unsigned = token_work(stats, prob["g"], None)
    A = torch.tensor([2.0, -0.5], dtype=torch.float64)
    signed = token_work(stats, prob["g"], A)
    torch.testing.assert_close(signed[0], unsigned[0], rtol=0, atol=0)
    torch.testing.assert_close(signed[1], -unsigned[1], rtol=0, atol=0)
    assert bool((token_work(stats, prob["g"], torch.zeros(2, dtype=torch.float64)) == 0).all())


def test_work_dtype_follows_the_widest_input() -> None:
    prob = _problem(seed=4, B=2, T=3, V=9, d=4)
    stats64 = policy_stats_from_logits(prob["logits"], prob["y"], prob["E"])
    assert token_work(stats64, prob["g"].float(), prob["A"]).dtype == torch.float64
    stats32 = policy_stats_from_logits(prob["logits"].float(), prob["y"], prob["E"].float())
    assert token_work(stats32, prob["g"].float(), prob["A"]).dtype == torch.float32
    assert token_work(stats32, prob["g"].bfloat16(), None).dtype == torch.float32
