"""Streamed policy statistics: hidden-state path == logits path == dense softmax reference.

``policy_stats`` (LM head streamed over vocabulary chunks and row blocks) must give the same
``PolicyStats`` as ``policy_stats_from_logits`` on the materialized logits, and both the
same as the dense definition p = softmax(logits / tau): p[y], sum p^2, p^T E, (p^2)^T E, E[y].
"""

from __future__ import annotations

import pytest
import torch

from credit_core import CreditError, PolicyStats, policy_stats, policy_stats_from_logits

pytestmark = pytest.mark.usefixtures("single_torch_thread")

FIELDS = ("p_sampled", "p_sq", "m1", "m2", "sampled_emb")
F32 = {"rtol": 2e-5, "atol": 2e-6}


def _inputs(
    seed: int = 0, B: int = 3, T: int = 5, H: int = 16, V: int = 75, d: int = 8
) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "hidden": torch.randn(B, T, H, generator=gen),
        "weight": torch.randn(V, H, generator=gen) / 2,
        "bias": torch.randn(V, generator=gen),
        "E": torch.randn(V, d, generator=gen),
        "y": torch.randint(0, V, (B, T), generator=gen),
    }


def _dense(logits: torch.Tensor, y: torch.Tensor, E: torch.Tensor, tau: float) -> PolicyStats:
    """The definition, in float64 with the whole (B, T, V) softmax materialized."""
    p = torch.softmax(logits.double() / tau, dim=-1)
    E64 = E.double()
    return PolicyStats(
        p_sampled=p.gather(-1, y.unsqueeze(-1)).squeeze(-1),
        p_sq=(p * p).sum(-1),
        m1=p @ E64,
        m2=(p * p) @ E64,
        sampled_emb=E64[y],
    )


def _assert_stats_close(actual: PolicyStats, expected: PolicyStats, **tol: float) -> None:
    for field in FIELDS:
        a, e = getattr(actual, field), getattr(expected, field)
        torch.testing.assert_close(a, e.to(a.dtype), msg=lambda m, f=field: f"{f}: {m}", **tol)


@pytest.mark.parametrize("chunk_size", [1, 7, 32, 75, 8192])
@pytest.mark.parametrize("temperature", [0.5, 1.0, 1.8])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("tile_elements", [1, 20, 1 << 22])
def test_hidden_path_equals_logits_path(
    chunk_size: int, temperature: float, with_bias: bool, tile_elements: int
) -> None:
    x = _inputs()
    bias = x["bias"] if with_bias else None
    logits = x["hidden"] @ x["weight"].T + (x["bias"] if with_bias else 0.0)
    kw = {"temperature": temperature, "chunk_size": chunk_size, "tile_elements": tile_elements}
    from_hidden = policy_stats(x["hidden"], x["weight"], x["y"], x["E"], lm_head_bias=bias, **kw)
    from_logits = policy_stats_from_logits(logits, x["y"], x["E"], **kw)
    for field in FIELDS:
        assert getattr(from_hidden, field).dtype == torch.float32
    _assert_stats_close(from_hidden, from_logits, **F32)
    _assert_stats_close(from_logits, _dense(logits, x["y"], x["E"], temperature), **F32)


def test_defaults_match_dense_reference() -> None:
    x = _inputs(seed=1, V=300)
    stats = policy_stats(x["hidden"], x["weight"], x["y"], x["E"])
    _assert_stats_close(stats, _dense(x["hidden"] @ x["weight"].T, x["y"], x["E"], 1.0), **F32)


def test_large_logits_stay_finite() -> None:
    """Logits in the hundreds overflow a naive exp; the running max keeps the sums finite."""
    x = _inputs(seed=2)
    logits = (x["hidden"] @ x["weight"].T) * 200.0
    stats = policy_stats_from_logits(logits, x["y"], x["E"], chunk_size=8)
    _assert_stats_close(stats, _dense(logits, x["y"], x["E"], 1.0), **F32)


@pytest.mark.parametrize("chunk_size", [1, 4, 16])
def test_minus_infinity_logits_are_zero_probability(chunk_size: int) -> None:
    """Masked vocabulary entries (logit -inf) get p = 0, even when a whole chunk is masked."""
    x = _inputs(seed=3, V=24)
    logits = x["hidden"] @ x["weight"].T
    logits[..., :8] = float("-inf")  # the first chunks hold nothing but masked entries
    logits[0, 0, 12:20] = float("-inf")  # a chunk masked in one row only
    y = x["y"].clamp_min(8)
    stats = policy_stats_from_logits(logits, y, x["E"], chunk_size=chunk_size)
    _assert_stats_close(stats, _dense(logits, y, x["E"], 1.0), **F32)
    sampled_masked = y.clone()
    sampled_masked[1, 2] = 3  # a sampled token with p = 0
    stats = policy_stats_from_logits(logits, sampled_masked, x["E"], chunk_size=chunk_size)
    assert float(stats.p_sampled[1, 2]) == 0.0
    _assert_stats_close(stats, _dense(logits, sampled_masked, x["E"], 1.0), **F32)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_bf16_inputs_give_float32_stats_close_to_float32(temperature: float) -> None:
    x = _inputs(seed=4, V=200)
    hidden, weight = x["hidden"].bfloat16(), x["weight"].bfloat16()
    kw = {"temperature": temperature}
    stats = policy_stats(hidden, weight, x["y"], x["E"], chunk_size=64, tile_elements=256, **kw)
    for field in FIELDS:
        assert getattr(stats, field).dtype == torch.float32, field
    # Only the LM-head matmul runs in bf16: from the same bf16 logits, everything after it
    # matches a float64 softmax to float32 accuracy (a bf16 accumulation would be off by ~1%).
    bf16_logits = (hidden @ weight.T).float()
    _assert_stats_close(stats, _dense(bf16_logits, x["y"], x["E"], temperature), **F32)
    # Against the float32 computation the bf16 rounding of the logits (relative 2^-8 of
    # logits of size ~5) remains: a few percent of each probability.
    full_f32 = policy_stats(x["hidden"], x["weight"], x["y"], x["E"], **kw)
    _assert_stats_close(stats, full_f32, rtol=0.1, atol=0.05)
    bf16_table = policy_stats(hidden, weight, x["y"], x["E"].bfloat16(), chunk_size=64, **kw)
    assert bf16_table.m1.dtype == torch.float32
    _assert_stats_close(bf16_table, full_f32, rtol=0.1, atol=0.05)


def test_float64_inputs_accumulate_in_float64() -> None:
    x = {k: (v.double() if v.is_floating_point() else v) for k, v in _inputs(seed=5).items()}
    stats = policy_stats(x["hidden"], x["weight"], x["y"], x["E"], chunk_size=9)
    assert stats.m1.dtype == torch.float64
    dense = _dense(x["hidden"] @ x["weight"].T, x["y"], x["E"], 1.0)
    _assert_stats_close(stats, dense, rtol=1e-12, atol=1e-12)


def test_stats_select_and_cat_round_trip() -> None:
    x = _inputs(seed=6)
    stats = policy_stats(x["hidden"], x["weight"], x["y"], x["E"], chunk_size=10)
    parts = [stats.select(slice(0, 1)), stats.select(torch.tensor([1, 2]))]
    _assert_stats_close(PolicyStats.cat(parts), stats, rtol=0, atol=0)
    assert stats.embed_dim == x["E"].shape[1]


def test_empty_batch_gives_empty_stats() -> None:
    x = _inputs(seed=7)
    stats = policy_stats(x["hidden"][:, :0], x["weight"], x["y"][:, :0], x["E"])
    assert stats.p_sampled.shape == (3, 0) and stats.m1.shape == (3, 0, 8)


@pytest.mark.parametrize("with_bias", [False, True])
def test_inputs_that_require_grad_give_the_same_constant_statistics(with_bias: bool) -> None:
    """No-grad by contract: an nn.Linear LM head and hidden states in the autograd graph are
    accepted; the statistics equal those of the detached inputs and carry no graph."""
    x = _inputs()
    lm_head = torch.nn.Linear(16, 75, bias=with_bias)
    hidden = (x["hidden"] * 1.0).requires_grad_()
    bias = lm_head.bias if with_bias else None
    got = policy_stats(hidden, lm_head.weight, x["y"], x["E"], lm_head_bias=bias, chunk_size=32)
    detached = policy_stats(
        hidden.detach(),
        lm_head.weight.detach(),
        x["y"],
        x["E"],
        lm_head_bias=None if bias is None else bias.detach(),
        chunk_size=32,
    )
    _assert_stats_close(got, detached, rtol=0.0, atol=0.0)
    assert not any(getattr(got, f).requires_grad for f in FIELDS)
    logits = lm_head(hidden)
    from_logits = policy_stats_from_logits(logits, x["y"], x["E"], chunk_size=32)
    assert not any(getattr(from_logits, f).requires_grad for f in FIELDS)
    assert torch.is_grad_enabled()


def test_float16_overflow_is_reported_at_its_tile() -> None:
    """A float16 LM-head matmul above 65504 is +inf: named where it happens, not later as
    non-finite DATC scores."""
    x = _inputs()
    hidden = torch.full((3, 5, 16), 100.0, dtype=torch.float16)
    weight = x["weight"].half()
    weight[40] = 100.0  # logit 100 * 100 * 16 = 160000 for vocabulary entry 40 only
    with pytest.raises(
        CreditError,
        match=r"logits \(hidden @ lm_head_weight\.T\): rows 0:15 x vocabulary 32:64: "
        r"logits overflow float16 .*65504.*float32 or bfloat16",
    ):
        policy_stats(hidden, weight, x["y"], x["E"], chunk_size=32)
    fine = policy_stats(hidden.float(), weight.float(), x["y"], x["E"], chunk_size=32)
    assert torch.isfinite(fine.m1).all()
    logits = (hidden.float() @ weight.float().T).half()  # +inf where it overflowed
    with pytest.raises(
        CreditError, match=r"^logits: rows 0:15 x vocabulary 32:64: logits overflow"
    ):
        policy_stats_from_logits(logits, x["y"], x["E"], chunk_size=32)


@pytest.mark.parametrize(("value", "kind"), [(float("nan"), "NaN"), (float("inf"), r"\+inf")])
def test_non_finite_logits_are_reported_at_their_tile(value: float, kind: str) -> None:
    """The first bad tile is named: its rows (row blocks of 5 here) and vocabulary chunk."""
    x = _inputs()
    logits = x["hidden"] @ x["weight"].T
    logits[1, 2, 70] = value  # flat row 1 * 5 + 2 = 7: the second row block
    logits[2, 4, 3] = value  # a later row block: not reached
    with pytest.raises(
        CreditError, match=rf"^logits: rows 5:10 x vocabulary 64:75: a logit is {kind}"
    ):
        policy_stats_from_logits(logits, x["y"], x["E"], chunk_size=32, tile_elements=5 * 32)
