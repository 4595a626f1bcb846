"""The two-matmul unsigned work W0 (``credit_core.streamed_work``) against the current path
(``policy_stats`` + ``token_work``) and against autograd on the soft relaxation, in float64;
chunking invariance, padding zeros, dtype rules, validation and the shape-chosen kernel."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from credit_core import (
    TWO_MATMUL_MIN_EMBED_DIM,
    CreditError,
    choose_work_path,
    policy_stats,
    streamed_unsigned_work,
    streamed_unsigned_work_from_logits,
    streamed_work_and_logprobs,
    token_work,
    unsigned_work,
    unsigned_work_from_logits,
)

pytestmark = pytest.mark.usefixtures("single_torch_thread")

F64 = torch.float64


def _problem(
    seed: int,
    B: int = 3,
    T: int = 4,
    V: int = 37,
    d: int = 6,
    H: int = 5,
    dtype: torch.dtype = F64,
    logit_scale: float = 3.0,
) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, H, generator=gen, dtype=dtype)
    weight = torch.randn(V, H, generator=gen, dtype=dtype) * logit_scale / H**0.5
    bias = torch.randn(V, generator=gen, dtype=dtype)
    return {
        "hidden": hidden,
        "weight": weight,
        "bias": bias,
        "logits": hidden @ weight.T + bias,
        "E": torch.randn(V, d, generator=gen, dtype=dtype),
        "g": torch.randn(B, T, d, generator=gen, dtype=dtype),
        "y": torch.randint(0, V, (B, T), generator=gen),
    }


def _autograd_w0(
    logits: torch.Tensor, E: torch.Tensor, g: torch.Tensor, y: torch.Tensor, tau: float
) -> torch.Tensor:
    """W0_t = < d/dzeta_t sum_t g_t . softmax(zeta_t)^T E , e_y - p_t >, zeta = logits / tau."""
    zeta = (logits / tau).detach().requires_grad_(True)
    p = torch.softmax(zeta, dim=-1)
    (grad,) = torch.autograd.grad((g * (p @ E)).sum(), zeta)
    onehot = torch.nn.functional.one_hot(y, logits.shape[-1]).to(logits.dtype)
    return (grad * (onehot - p.detach())).sum(-1)


def _current_path(x: dict[str, torch.Tensor], tau: float, **kw: int) -> torch.Tensor:
    stats = policy_stats(
        x["hidden"], x["weight"], x["y"], x["E"], temperature=tau, lm_head_bias=x["bias"], **kw
    )
    return token_work(stats, x["g"], None)


@pytest.mark.parametrize(
    ("V", "chunk_size", "tile_elements"),
    [(37, 8, 1 << 22), (37, 1, 3), (37, 64, 1 << 22), (37, 37, 40), (64, 16, 48)],
)
@pytest.mark.parametrize("temperature", [1.0, 0.6, 2.3])
def test_float64_equals_the_current_path_and_autograd(
    V: int, chunk_size: int, tile_elements: int, temperature: float
) -> None:
    x = _problem(seed=V + chunk_size, V=V)
    kw = {"chunk_size": chunk_size, "tile_elements": tile_elements}
    w0 = streamed_unsigned_work(
        x["hidden"],
        x["weight"],
        x["y"],
        x["E"],
        x["g"],
        temperature=temperature,
        lm_head_bias=x["bias"],
        **kw,
    )
    from_logits = streamed_unsigned_work_from_logits(
        x["logits"], x["y"], x["E"], x["g"], temperature=temperature, **kw
    )
    assert w0.dtype == F64 and w0.shape == x["y"].shape
    reference = _autograd_w0(x["logits"], x["E"], x["g"], x["y"], temperature)
    torch.testing.assert_close(w0, reference, rtol=0, atol=1e-10)
    torch.testing.assert_close(from_logits, reference, rtol=0, atol=1e-10)
    torch.testing.assert_close(w0, _current_path(x, temperature, **kw), rtol=0, atol=1e-12)


@settings(max_examples=30, deadline=None)
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
def test_random_shapes_match_autograd(
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
    x = _problem(seed, B, T, V, d, logit_scale=logit_scale)
    w0 = streamed_unsigned_work_from_logits(
        x["logits"],
        x["y"],
        x["E"],
        x["g"],
        temperature=temperature,
        chunk_size=chunk_size,
        tile_elements=tile_elements,
    )
    reference = _autograd_w0(x["logits"], x["E"], x["g"], x["y"], temperature)
    torch.testing.assert_close(w0, reference, rtol=0, atol=1e-10)


def test_float32_is_invariant_to_chunking_and_matches_the_current_path() -> None:
    x = {k: v.float() if v.is_floating_point() else v for k, v in _problem(1, V=300).items()}
    base = streamed_unsigned_work(x["hidden"], x["weight"], x["y"], x["E"], x["g"])
    assert base.dtype == torch.float32
    scale = float(base.abs().max())
    for chunk_size, tile_elements in [(1, 1), (7, 20), (64, 64), (300, 1 << 22), (4096, 5)]:
        w0 = streamed_unsigned_work(
            x["hidden"],
            x["weight"],
            x["y"],
            x["E"],
            x["g"],
            chunk_size=chunk_size,
            tile_elements=tile_elements,
        )
        torch.testing.assert_close(w0, base, rtol=0, atol=1e-5 * scale)
    stats = policy_stats(x["hidden"], x["weight"], x["y"], x["E"])
    torch.testing.assert_close(base, token_work(stats, x["g"], None), rtol=0, atol=1e-5 * scale)


def test_zero_reward_gradient_gives_exactly_zero_work() -> None:
    """Padding: the reward gradient is 0 there, so W0 is exactly 0 (no masking needed)."""
    x = _problem(2, dtype=torch.float32)
    g = x["g"].clone()
    g[0, 2:] = 0.0
    g[2] = 0.0
    w0 = streamed_unsigned_work(x["hidden"], x["weight"], x["y"], x["E"], g, chunk_size=5)
    assert bool((w0[0, 2:] == 0).all()) and bool((w0[2] == 0).all())
    assert bool((w0[1] != 0).all())


def test_dtype_rules_follow_policy_stats() -> None:
    x = _problem(3, V=200, dtype=torch.float32)
    h16, w16 = x["hidden"].bfloat16(), x["weight"].bfloat16()
    bf16_head = streamed_unsigned_work(h16, w16, x["y"], x["E"], x["g"], chunk_size=64)
    assert bf16_head.dtype == torch.float32
    # Only the LM-head matmul is bf16: from the same bf16 logits, float32 accuracy.
    same_logits = streamed_unsigned_work_from_logits(
        (h16 @ w16.T).float(), x["y"], x["E"], x["g"], chunk_size=64
    )
    torch.testing.assert_close(bf16_head, same_logits, rtol=1e-5, atol=1e-6)
    bf16_table = streamed_unsigned_work(h16, w16, x["y"], x["E"].bfloat16(), x["g"])
    assert bf16_table.dtype == torch.float32
    g64 = streamed_unsigned_work(x["hidden"], x["weight"], x["y"], x["E"], x["g"].double())
    assert g64.dtype == F64
    # The bf16 kernels agree with the current path on the same bf16 inputs.
    stats = policy_stats(h16, w16, x["y"], x["E"].bfloat16())
    torch.testing.assert_close(bf16_table, token_work(stats, x["g"], None), rtol=1e-4, atol=1e-5)


def test_empty_batch_gives_empty_work() -> None:
    x = _problem(4)
    w0 = streamed_unsigned_work(
        x["hidden"][:, :0], x["weight"], x["y"][:, :0], x["E"], x["g"][:, :0]
    )
    assert w0.shape == (3, 0)


def test_work_is_not_differentiable() -> None:
    x = _problem(5)
    hidden = x["hidden"].requires_grad_(True)
    w0 = streamed_unsigned_work(hidden, x["weight"], x["y"], x["E"], x["g"])
    assert not w0.requires_grad


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"g": torch.zeros(3, 4, 5, dtype=F64)}, r"reward_grad: expected shape \(3, 4, 6\)"),
        ({"g": torch.zeros(3, 4, 6, dtype=torch.long)}, r"reward_grad: expected a floating"),
        ({"E": torch.zeros(36, 6, dtype=F64)}, r"reward_embedding: expected shape \(37, \*\)"),
        ({"y": torch.full((3, 4), 37)}, r"token_ids: expected values in \[0, 37\)"),
        ({"tile_elements": 0}, r"tile_elements: expected an integer >= 1"),
        ({"chunk_size": 0}, r"chunk_size: expected an integer >= 1"),
        ({"temperature": 0.0}, r"temperature: expected a finite value > 0"),
    ],
)
def test_bad_inputs_name_the_tensor(change: dict[str, object], message: str) -> None:
    x: dict[str, object] = {**_problem(6), "tile_elements": 64, "chunk_size": 8}
    x["temperature"] = 1.0
    x.update(change)
    with pytest.raises(CreditError, match=message):
        streamed_unsigned_work(
            x["hidden"],  # type: ignore[arg-type]
            x["weight"],  # type: ignore[arg-type]
            x["y"],  # type: ignore[arg-type]
            x["E"],  # type: ignore[arg-type]
            x["g"],  # type: ignore[arg-type]
            temperature=x["temperature"],  # type: ignore[arg-type]
            chunk_size=x["chunk_size"],  # type: ignore[arg-type]
            tile_elements=x["tile_elements"],  # type: ignore[arg-type]
        )


def test_kernel_is_chosen_by_the_embedding_width_and_both_agree() -> None:
    assert choose_work_path(TWO_MATMUL_MIN_EMBED_DIM) == "two_matmul"
    assert choose_work_path(TWO_MATMUL_MIN_EMBED_DIM - 1) == "stats"
    assert choose_work_path(8, "two_matmul") == "two_matmul"
    assert choose_work_path(4096, "stats") == "stats"
    with pytest.raises(CreditError, match=r"path: expected one of \['auto', 'two_matmul'"):
        choose_work_path(8, "fast")
    x = _problem(7)
    args = (x["hidden"], x["weight"], x["y"], x["E"], x["g"])
    kw = {"temperature": 0.8, "lm_head_bias": x["bias"], "chunk_size": 9}
    two = unsigned_work(*args, path="two_matmul", **kw)  # type: ignore[arg-type]
    stats = unsigned_work(*args, path="stats", **kw)  # type: ignore[arg-type]
    auto = unsigned_work(*args, **kw)  # type: ignore[arg-type]
    torch.testing.assert_close(two, stats, rtol=0, atol=1e-12)
    assert torch.equal(auto, stats)  # d = 6 < the crossover
    logit_args = (x["logits"], x["y"], x["E"], x["g"])
    for path in ("two_matmul", "stats"):
        got = unsigned_work_from_logits(*logit_args, temperature=0.8, path=path)
        torch.testing.assert_close(got, two, rtol=0, atol=1e-12)
    with pytest.raises(CreditError, match=r"reward_grad: expected shape \(3, 4, 6\)"):
        unsigned_work(*args[:4], x["g"][:, :2], path="stats")


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_the_same_pass_gives_the_log_probabilities(temperature: float) -> None:
    x = _problem(8, V=50)
    w0, logp = streamed_work_and_logprobs(
        x["hidden"],
        x["weight"],
        x["y"],
        x["E"],
        x["g"],
        temperature=temperature,
        lm_head_bias=x["bias"],
        chunk_size=7,
        tile_elements=21,
    )
    want = torch.log_softmax(x["logits"] / temperature, -1).gather(2, x["y"][..., None])[..., 0]
    torch.testing.assert_close(logp, want, rtol=0, atol=1e-12)
    torch.testing.assert_close(
        w0, _autograd_w0(x["logits"], x["E"], x["g"], x["y"], temperature), rtol=0, atol=1e-10
    )


def test_float16_overflow_and_non_finite_logits_are_reported_at_their_tile() -> None:
    """The checks of ``policy_stats`` hold for W0 too: a float16 LM-head matmul above 65504
    is named at its tile, and so is a NaN in materialized logits."""
    x = _problem(0, B=3, T=5, V=70, d=6, H=16, dtype=torch.float32)
    hidden = torch.full((3, 5, 16), 100.0, dtype=torch.float16)
    weight = x["weight"].half()
    weight[40] = 100.0  # logit 160000 for vocabulary entry 40 only
    with pytest.raises(
        CreditError,
        match=r"logits \(hidden @ lm_head_weight\.T\): rows 0:15 x vocabulary 32:64: "
        r"logits overflow float16",
    ):
        streamed_unsigned_work(hidden, weight, x["y"], x["E"], x["g"], chunk_size=32)
    fine = streamed_unsigned_work(
        hidden.float(), weight.float(), x["y"], x["E"], x["g"], chunk_size=32
    )
    assert torch.isfinite(fine).all()
    logits = x["logits"].clone()
    logits[1, 2, 50] = float("nan")
    with pytest.raises(CreditError, match=r"^logits: rows 0:15 x vocabulary 32:64: a logit is NaN"):
        streamed_unsigned_work_from_logits(logits, x["y"], x["E"], x["g"], chunk_size=32)
