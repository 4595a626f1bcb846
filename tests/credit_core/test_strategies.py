"""The allocation rule, its invariants, and every built-in strategy.

docs/design.md, "From one advantage to many" and "Strategies".

Invariants of every score-based strategy, for every response: the sign of A is kept
(w > 0 for lam < 1, w >= 0 always), the mean of the token advantages over the valid tokens is
A, padding is exactly 0, A = 0 gives zeros, one valid token or constant scores give w = 1,
lam = 0 gives uniform; a non-finite score raises (default) or falls back to w = 1 for that
response only, counted in the diagnostics.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from credit_core import (
    CreditBatch,
    CreditError,
    allocate_weights,
    get_strategy,
    policy_stats_from_logits,
    token_work,
)

pytestmark = pytest.mark.usefixtures("single_torch_thread")

SCORE_BASED = (
    "datc",
    "datc_mid",
    "datc_ig",
    "datc_unsigned",
    "datc_nosign",
    "datc_shuffled",
    "datc_inverse",
    "saliency",
)
SETTINGS = settings(max_examples=30, deadline=None)


def make_batch(
    seed: int,
    B: int = 4,
    T: int = 7,
    V: int = 13,
    d: int = 5,
    *,
    mask: torch.Tensor | None = None,
    advantages: torch.Tensor | None = None,
) -> CreditBatch:
    """A batch with random policy stats and reward gradients; rows keep >= 1 valid token."""
    gen = torch.Generator().manual_seed(seed)
    if mask is None:
        mask = torch.rand(B, T, generator=gen) < 0.7
        mask[torch.arange(B), torch.randint(0, T, (B,), generator=gen)] = True
    if advantages is None:
        advantages = torch.randn(B, generator=gen) * 2
    token_ids = torch.randint(0, V, (B, T), generator=gen)
    logits = torch.randn(B, T, V, generator=gen) * 3
    E = torch.randn(V, d, generator=gen)
    return CreditBatch(
        advantages=advantages,
        mask=mask,
        token_ids=token_ids,
        reward_grad=torch.randn(B, T, d, generator=gen),
        policy_stats=policy_stats_from_logits(logits, token_ids, E, chunk_size=4),
    )


@st.composite
def batches(draw: st.DrawFn) -> CreditBatch:
    B, T = draw(st.integers(1, 4)), draw(st.integers(1, 9))
    lengths = draw(st.lists(st.integers(1, T), min_size=B, max_size=B))
    contiguous = draw(st.booleans())
    seed = draw(st.integers(0, 2**31 - 1))
    if contiguous:  # right-padded responses, the layout backends produce
        mask = torch.arange(T).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
    else:  # any pattern with at least one valid token per row
        gen = torch.Generator().manual_seed(seed + 1)
        mask = torch.rand(B, T, generator=gen) < 0.5
        mask[:, 0] = True
    adv = draw(
        st.lists(
            st.one_of(
                st.just(0.0),
                st.floats(-50, 50, allow_subnormal=False).filter(lambda a: abs(a) > 1e-3),
            ),
            min_size=B,
            max_size=B,
        )
    )
    return make_batch(seed, B, T, mask=mask, advantages=torch.tensor(adv))


params = st.fixed_dictionaries(
    {
        "beta": st.floats(0.05, 8.0),
        "lam": st.one_of(st.sampled_from([0.0, 0.5, 1.0]), st.floats(0.0, 1.0)),
    }
)


def reference_weights(scores: torch.Tensor, mask: torch.Tensor, beta: float, lam: float):
    """docs/design.md's allocation, one response at a time in float64 (the spec, transcribed)."""
    w = torch.zeros(scores.shape, dtype=torch.float64)
    for i in range(scores.shape[0]):
        s = scores[i][mask[i]].double()
        n = s.numel()
        s_hat = s / (torch.sqrt((s * s).mean()) + 1e-8)
        w[i][mask[i]] = (1 - lam) + lam * n * torch.softmax(beta * s_hat, dim=0)
    return w


def expected_scores(name: str, batch: CreditBatch) -> torch.Tensor:
    """The score column of docs/design.md's strategy table for ``name`` (shuffling aside)."""
    assert batch.policy_stats is not None and batch.reward_grad is not None
    work = token_work(batch.policy_stats, batch.reward_grad, batch.advantages)
    return {
        "datc": work,
        "datc_mid": work,  # the path gradient is the backend's; the allocation is DATC's
        "datc_ig": work,
        "datc_shuffled": work,
        "datc_unsigned": work.abs(),
        "datc_nosign": token_work(batch.policy_stats, batch.reward_grad, None),
        "datc_inverse": -work,
        "saliency": batch.reward_grad.norm(dim=-1),
    }[name]


def row_means(token_adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return token_adv.double().sum(dim=1) / mask.sum(dim=1)


# ---------------------------------------------------------------- invariants (hypothesis)


@pytest.mark.parametrize("name", SCORE_BASED)
@SETTINGS
@given(batch=batches(), p=params)
def test_score_strategy_invariants(name: str, batch: CreditBatch, p: dict[str, float]) -> None:
    result = get_strategy(name, **p).assign_with_diagnostics(batch)
    adv, mask, A = result.token_advantages, batch.mask, batch.advantages
    assert adv.dtype == torch.float32 and adv.shape == mask.shape
    assert bool((adv[~mask] == 0).all()), "padding must be exactly 0"
    A_tok = A.unsqueeze(1).expand_as(mask)[mask]
    if p["lam"] < 1.0:
        assert torch.equal(torch.sign(adv[mask]), torch.sign(A_tok)), "sign of A kept"
    assert bool((adv[mask] * A_tok >= 0).all()), "w >= 0 always"
    torch.testing.assert_close(row_means(adv, mask), A.double(), rtol=1e-5, atol=1e-30)
    assert bool((adv[A == 0] == 0).all())
    if p["lam"] == 0.0:
        assert torch.equal(adv, torch.where(mask, A.unsqueeze(1), 0.0))
    d = result.diagnostics
    assert d.nonfinite_fallbacks == 0
    assert 0.0 <= d.weight_min <= 1.0 + 1e-9 <= d.weight_max + 2e-9
    assert 0.0 <= d.frac_upweighted <= 1.0 and 0.0 <= d.weight_entropy <= 1.0 + 1e-9


@pytest.mark.parametrize("name", [n for n in SCORE_BASED if n != "datc_shuffled"])
@SETTINGS
@given(batch=batches(), p=params)
def test_score_strategy_follows_the_allocation_rule(
    name: str, batch: CreditBatch, p: dict[str, float]
) -> None:
    """A_t = A * w_t with w from docs/design.md's formula applied to the strategy's own score."""
    adv = get_strategy(name, **p).assign(batch)
    w = reference_weights(expected_scores(name, batch), batch.mask, p["beta"], p["lam"])
    expected = (batch.advantages.double().unsqueeze(1) * w).float()
    torch.testing.assert_close(adv, expected, rtol=1e-5, atol=1e-6)


@SETTINGS
@given(batch=batches(), p=params)
def test_allocate_weights_matches_the_formula(batch: CreditBatch, p: dict[str, float]) -> None:
    gen = torch.Generator().manual_seed(batch.mask.numel())
    scores = torch.randn(batch.mask.shape, generator=gen) * 10
    scores[~batch.mask] = float("nan")  # padding is ignored, whatever it holds
    w, _ = allocate_weights(scores, batch.mask, on_nonfinite="error", **p)
    assert w.dtype == torch.float64
    torch.testing.assert_close(w, reference_weights(scores, batch.mask, p["beta"], p["lam"]))
    n = batch.mask.sum(dim=1)
    torch.testing.assert_close(w.sum(dim=1), n.double(), rtol=1e-12, atol=0)
    assert bool((w[~batch.mask] == 0).all())


# ---------------------------------------------------------------- special cases


@pytest.mark.parametrize("name", SCORE_BASED)
def test_zero_advantage_gives_zeros(name: str) -> None:
    batch = make_batch(0, advantages=torch.zeros(4))
    assert bool((get_strategy(name).assign(batch) == 0).all())


@pytest.mark.parametrize("name", SCORE_BASED)
@pytest.mark.parametrize("lam", [0.3, 1.0])
def test_one_valid_token_gives_weight_one(name: str, lam: float) -> None:
    mask = torch.zeros(4, 6, dtype=torch.bool)
    mask[torch.arange(4), torch.tensor([0, 5, 2, 3])] = True
    batch = make_batch(1, T=6, mask=mask, advantages=torch.tensor([1.5, -2.0, 0.25, -0.1]))
    adv = get_strategy(name, lam=lam, beta=5.0).assign(batch)
    torch.testing.assert_close(adv.sum(dim=1), batch.advantages, rtol=1e-6, atol=0)
    assert int((adv != 0).sum()) == 4


@pytest.mark.parametrize("name", SCORE_BASED)
def test_no_reward_signal_gives_uniform(name: str) -> None:
    """g = 0 makes every score 0 (W = 0, ||g|| = 0): constant scores, so w = 1."""
    batch = make_batch(2)
    assert batch.reward_grad is not None
    batch = replace(batch, reward_grad=torch.zeros_like(batch.reward_grad))
    adv = get_strategy(name, lam=1.0, beta=3.0).assign(batch)
    uniform = torch.where(batch.mask, batch.advantages.unsqueeze(1), 0.0)
    torch.testing.assert_close(adv, uniform, rtol=1e-6, atol=0)


def test_saliency_with_equal_gradient_norms_gives_uniform() -> None:
    batch = make_batch(3, d=2)
    angle = torch.rand(batch.mask.shape, generator=torch.Generator().manual_seed(0)) * 6
    grad = torch.stack([torch.cos(angle), torch.sin(angle)], dim=-1) * 0.37  # all norms equal
    adv = get_strategy("saliency", lam=1.0, beta=8.0).assign(replace(batch, reward_grad=grad))
    uniform = torch.where(batch.mask, batch.advantages.unsqueeze(1), 0.0)
    torch.testing.assert_close(adv, uniform, rtol=1e-6, atol=0)


@pytest.mark.parametrize("value", [0.0, 1.0, -3.5, 1e6, -1e-7])
@pytest.mark.parametrize("lam", [0.5, 1.0])
def test_allocate_weights_constant_scores_give_one(value: float, lam: float) -> None:
    mask = torch.tensor([[True, True, True, False], [True, False, True, True]])
    w, diag = allocate_weights(
        torch.full((2, 4), value), mask, beta=4.0, lam=lam, on_nonfinite="error"
    )
    torch.testing.assert_close(w, mask.double(), rtol=1e-12, atol=0)
    assert diag.frac_upweighted == 0.0 and math.isclose(diag.weight_entropy, 1.0)


def test_allocate_weights_single_token_and_lam_one_edge() -> None:
    mask = torch.tensor([[False, True, False]])
    scores = torch.tensor([[9.0, -4.0, 2.0]])
    w, _ = allocate_weights(scores, mask, beta=1.0, lam=1.0, on_nonfinite="error")
    assert w.tolist() == [[0.0, 1.0, 0.0]]
    # lam = 1 with an extreme score spread: weights may underflow to 0 but never go negative.
    scores = torch.tensor([[100.0, -100.0, -100.0, -100.0]])
    full = torch.ones(1, 4, dtype=torch.bool)
    w, _ = allocate_weights(scores, full, beta=50.0, lam=1.0, on_nonfinite="error")
    assert bool((w >= 0).all()) and math.isclose(float(w.sum()), 4.0)


def test_diagnostics_summarize_the_weights() -> None:
    mask = torch.tensor([[True, True, False], [True, True, True]])
    scores = torch.tensor([[1.0, -1.0, 0.0], [2.0, 2.0, 2.0]])
    w, diag = allocate_weights(scores, mask, beta=1.0, lam=1.0, on_nonfinite="error")
    # Row 0: s_hat = (1, -1) (up to the 1e-8 in rms + 1e-8), w = 2 softmax(1, -1)
    # = (2 sigma(2), 2 sigma(-2)); row 1: constant scores, w = 1.
    hi, lo = 2 / (1 + math.exp(-2)), 2 / (1 + math.exp(2))
    torch.testing.assert_close(w[0, :2], torch.tensor([hi, lo], dtype=torch.float64))
    share = (hi / 2, lo / 2)
    entropy0 = -sum(s * math.log(s) for s in share) / math.log(2)
    close = {"rel_tol": 1e-7}
    assert math.isclose(diag.weight_max, hi, **close)
    assert math.isclose(diag.weight_min, lo, **close)
    assert math.isclose(diag.weight_entropy, (entropy0 + 1.0) / 2, **close)
    assert math.isclose(diag.frac_upweighted, 1 / 5, **close)
    assert diag.to_dict() == {
        "credit/weight_max": diag.weight_max,
        "credit/weight_min": diag.weight_min,
        "credit/weight_entropy": diag.weight_entropy,
        "credit/frac_upweighted": diag.frac_upweighted,
        "credit/nonfinite_fallbacks": 0.0,
        "credit/uniform_fallbacks": 0.0,
    }
    assert set(diag.to_dict(prefix="")) == {
        "weight_max",
        "weight_min",
        "weight_entropy",
        "frac_upweighted",
        "nonfinite_fallbacks",
        "uniform_fallbacks",
    }


# ---------------------------------------------------------------- non-finite scores


def _poison(batch: CreditBatch, rows: list[int], value: float) -> CreditBatch:
    """Put ``value`` into reward_grad at the first valid token of each of ``rows``."""
    assert batch.reward_grad is not None
    grad = batch.reward_grad.clone()
    for r in rows:
        t = int(torch.nonzero(batch.mask[r])[0])
        grad[r, t, 0] = value
    return replace(batch, reward_grad=grad)


@pytest.mark.parametrize("name", SCORE_BASED)
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nonfinite_uniform_fallback_is_per_response(name: str, value: float) -> None:
    clean = make_batch(4, B=5)
    bad_rows = [1, 3]
    dirty = _poison(clean, bad_rows, value)
    kw = {"on_nonfinite": "uniform", "lam": 0.8}
    if name == "datc_shuffled":
        kw["seed"] = 7
    expected = get_strategy(name, **kw).assign(clean)
    result = get_strategy(name, **kw).assign_with_diagnostics(dirty)
    adv = result.token_advantages
    assert result.diagnostics.nonfinite_fallbacks == len(bad_rows)
    uniform = torch.where(clean.mask, clean.advantages.unsqueeze(1), 0.0)
    torch.testing.assert_close(adv[bad_rows], uniform[bad_rows], rtol=1e-6, atol=0)
    good = [0, 2, 4]
    assert torch.equal(adv[good], expected[good]), "other responses are unaffected"


@pytest.mark.parametrize("name", SCORE_BASED)
def test_nonfinite_error_names_the_responses(name: str) -> None:
    dirty = _poison(make_batch(5, B=5), [0, 3], float("nan"))
    with pytest.raises(CreditError, match=rf"{name} scores.*\[0, 3\].*on_nonfinite"):
        get_strategy(name).assign(dirty)


@pytest.mark.parametrize("name", SCORE_BASED)
def test_nonfinite_values_at_padding_are_ignored(name: str) -> None:
    batch = make_batch(6)
    assert batch.reward_grad is not None
    grad = torch.where(batch.mask.unsqueeze(-1), batch.reward_grad, float("nan"))
    kw = {"seed": 3} if name == "datc_shuffled" else {}
    result = get_strategy(name, **kw).assign_with_diagnostics(replace(batch, reward_grad=grad))
    assert result.diagnostics.nonfinite_fallbacks == 0
    assert torch.equal(result.token_advantages, get_strategy(name, **kw).assign(batch))


def test_allocate_weights_nonfinite_policies() -> None:
    mask = torch.ones(3, 4, dtype=torch.bool)
    scores = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    scores[2, 1] = float("-inf")
    w, diag = allocate_weights(scores, mask, beta=1.0, lam=0.5, on_nonfinite="uniform")
    assert diag.nonfinite_fallbacks == 1 and w[2].tolist() == [1.0] * 4
    torch.testing.assert_close(w[:2], reference_weights(scores[:2], mask[:2], 1.0, 0.5))
    with pytest.raises(CreditError, match=r"my_scores: non-finite values in responses \[2\]"):
        allocate_weights(
            scores, mask, beta=1.0, lam=0.5, on_nonfinite="error", score_name="my_scores"
        )


# ---------------------------------------------------------------- datc_shuffled, uniform


def _sorted_valid(adv: torch.Tensor, mask: torch.Tensor) -> list[list[float]]:
    return [sorted(adv[i][mask[i]].tolist()) for i in range(mask.shape[0])]


@SETTINGS
@given(batch=batches(), seed=st.integers(0, 2**32), p=params)
def test_shuffled_is_a_per_row_permutation_of_datc(
    batch: CreditBatch, seed: int, p: dict[str, float]
) -> None:
    datc = get_strategy("datc", **p).assign(batch)
    shuffled = get_strategy("datc_shuffled", seed=seed, **p).assign(batch)
    assert bool((shuffled[~batch.mask] == 0).all())
    assert _sorted_valid(shuffled, batch.mask) == _sorted_valid(datc, batch.mask)


def test_shuffled_is_seeded() -> None:
    mask = torch.ones(3, 16, dtype=torch.bool)
    batch = make_batch(7, B=3, T=16, mask=mask, advantages=torch.tensor([1.0, -2.0, 0.5]))
    first = get_strategy("datc_shuffled", seed=11, lam=1.0).assign(batch)
    again = get_strategy("datc_shuffled", seed=11, lam=1.0).assign(batch)
    other = get_strategy("datc_shuffled", seed=12, lam=1.0).assign(batch)
    datc = get_strategy("datc", lam=1.0).assign(batch)
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    assert not torch.equal(first, datc)
    assert _sorted_valid(other, mask) == _sorted_valid(datc, mask)


def test_shuffled_generator_advances_between_calls() -> None:
    batch = make_batch(8, B=2, T=12, mask=torch.ones(2, 12, dtype=torch.bool))
    strategy = get_strategy("datc_shuffled", seed=5)
    assert not torch.equal(strategy.assign(batch), strategy.assign(batch))


@SETTINGS
@given(batch=batches())
def test_uniform_is_the_advantage_broadcast_over_the_mask(batch: CreditBatch) -> None:
    result = get_strategy("uniform").assign_with_diagnostics(batch)
    expected = torch.where(batch.mask, batch.advantages.float().unsqueeze(1), 0.0)
    assert result.token_advantages.dtype == torch.float32
    assert torch.equal(result.token_advantages, expected)
    assert result.diagnostics.weight_max == 1.0 and result.diagnostics.nonfinite_fallbacks == 0


def test_uniform_needs_no_signal() -> None:
    batch = CreditBatch(
        advantages=torch.tensor([0.5, -1.0], dtype=torch.float64),
        mask=torch.tensor([[True, True, False], [True, False, False]]),
        token_ids=torch.zeros(2, 3, dtype=torch.long),
    )
    assert get_strategy("uniform").requires == frozenset()
    assert get_strategy("uniform").assign(batch).tolist() == [[0.5, 0.5, 0.0], [-1.0, 0.0, 0.0]]


# ---------------------------------------------------------------- required signals


@pytest.mark.parametrize(
    ("name", "requires"),
    [
        ("uniform", set()),
        ("datc", {"reward_grad", "policy_stats"}),
        ("datc_mid", {"reward_grad", "policy_stats"}),
        ("datc_ig", {"reward_grad", "policy_stats"}),
        ("datc_unsigned", {"reward_grad", "policy_stats"}),
        ("datc_nosign", {"reward_grad", "policy_stats"}),
        ("datc_shuffled", {"reward_grad", "policy_stats"}),
        ("datc_inverse", {"reward_grad", "policy_stats"}),
        ("saliency", {"reward_grad"}),
    ],
)
def test_required_signals_are_declared_and_enforced(name: str, requires: set[str]) -> None:
    strategy = get_strategy(name)
    assert strategy.name == name and strategy.requires == frozenset(requires)
    full = make_batch(9)
    strategy.assign(full)
    for signal in requires:
        with pytest.raises(CreditError, match=rf"'{name}' requires signal '{signal}'"):
            strategy.assign(replace(full, **{signal: None}))


@pytest.mark.parametrize(
    ("name", "params", "points"),
    [
        ("uniform", {}, 0),
        ("datc", {}, 0),
        ("saliency", {}, 0),
        ("datc_mid", {}, 1),
        ("datc_ig", {}, 4),
        ("datc_ig", {"points": 8}, 8),
    ],
)
def test_where_the_reward_gradient_is_taken(name: str, params: dict[str, int], points: int) -> None:
    """0: at the sampled tokens (DATC as published); n: averaged over n points of the path
    to the expected embeddings (docs/design.md, "Curvature-robust direction")."""
    assert get_strategy(name, **params).reward_grad_points == points


@pytest.mark.parametrize("points", [1, 65, True])
def test_the_integrated_gradient_takes_two_to_64_points(points: object) -> None:
    with pytest.raises(CreditError, match="parameter 'points'"):
        get_strategy("datc_ig", points=points)


def test_shuffled_state_dict_resumes_the_permutation_stream() -> None:
    """A strategy restored from state_dict continues exactly where the original was."""
    batch = _resume_batch()
    first = get_strategy("datc_shuffled", seed=7)
    first.assign(batch)
    saved = first.state_dict()
    expected = first.assign(batch)
    restored = get_strategy("datc_shuffled", seed=7)
    restored.load_state_dict(saved)
    assert torch.equal(restored.assign(batch), expected)
    fresh = get_strategy("datc_shuffled", seed=7)
    assert not torch.equal(fresh.assign(batch), expected)


def test_stateless_strategy_rejects_foreign_state() -> None:
    strategy = get_strategy("datc")
    assert strategy.state_dict() == {}
    with pytest.raises(CreditError, match="'datc' has no state"):
        strategy.load_state_dict({"generator": torch.Generator().get_state()})
    with pytest.raises(CreditError, match="expected state keys"):
        get_strategy("datc_shuffled").load_state_dict({})


def _resume_batch() -> CreditBatch:
    gen = torch.Generator().manual_seed(0)
    B, T, V, d = 3, 9, 11, 4
    logits = torch.randn(B, T, V, generator=gen)
    ids = torch.randint(0, V, (B, T), generator=gen)
    emb = torch.randn(V, d, generator=gen)
    return CreditBatch(
        advantages=torch.tensor([1.0, -2.0, 0.5]),
        mask=torch.ones(B, T, dtype=torch.bool),
        token_ids=ids,
        reward_grad=torch.randn(B, T, d, generator=gen),
        policy_stats=policy_stats_from_logits(logits, ids, emb),
    )
