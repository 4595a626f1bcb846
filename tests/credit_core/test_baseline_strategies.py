"""The published token-credit baselines (docs/design.md, "Baselines").

- ``entropy_top`` keeps the valid tokens whose entropy reaches the (1 - rho) quantile of the
  step's entropies (every process), ties kept: exactly TRL's ``get_high_entropy_mask``.
  ``mask`` mode: A_t = A M_t. ``weight`` mode: w_t = M_t n / sum M_t, uniform for a response
  with no selected token (counted).
- ``random_top`` is the same rule on seeded uniform keys; its stream resumes exactly.
- ``abc``: w_t = (1 - beta) + beta n alpha_t; uniform without attention mass or with n = 1.
- ``red``: w_t proportional to max(sign(A) r_t, 0) + eps, mean 1.
- The paper forms (``mode: paper``) of ``abc`` and ``red`` are their token rewards, beta R
  alpha_t + (1 - beta) R 1[t = T] and r_t, turned into advantages within each group
  (docs/design.md, "Token rewards to advantages"); they read the rewards and groups.

- ``red`` and ``p2t`` with ``allocation: softmax_floor`` (the matched-allocation control) are
  DATC's allocation of s_t = sign(A) r_t: equal to DATC given W0 = r, and to the formula
  written out. Today's forms stay the defaults; a parameter a form does not read is refused.
- ``paper_route: step_norm`` turns a paper form's token rewards into advantages by
  ``group_step_advantages`` (DeepSeekMath's per-step normalisation).

Every weight form keeps the sign of A, the per-response mean A and 0 at padding.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from credit_core import (
    CreditBatch,
    CreditError,
    CreditSignals,
    assign_credit,
    get_strategy,
    group_advantages,
)
from credit_core.token_rewards import group_return_advantages, group_step_advantages
from credit_core.token_selection import batch_quantile

pytestmark = pytest.mark.usefixtures("single_torch_thread")

SETTINGS = settings(max_examples=40, deadline=None)


def random_batch(seed: int, B: int = 5, T: int = 9) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages (B,), mask (B, T)) with every row holding >= 1 valid token, one A = 0."""
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(B, T, generator=gen) < 0.7
    mask[torch.arange(B), torch.randint(0, T, (B,), generator=gen)] = True
    adv = torch.randn(B, generator=gen)
    adv[0] = 0.0
    return adv, mask


def trl_high_entropy_mask(entropies: torch.Tensor, mask: torch.Tensor, rho: float) -> torch.Tensor:
    """TRL 1.16 ``GRPOTrainer.get_high_entropy_mask`` on one process, written out."""
    threshold = torch.quantile(entropies[mask].float(), 1 - rho)
    return ((entropies * mask.float()) >= threshold) & mask


def assert_mean_keeping(adv: torch.Tensor, mask: torch.Tensor, token_adv: torch.Tensor) -> None:
    """Sign of A kept, per-response mean A, exactly 0 at padding."""
    assert bool((token_adv[~mask] == 0).all())
    n = mask.sum(dim=1)
    torch.testing.assert_close(token_adv.sum(dim=1) / n, adv, atol=1e-5, rtol=1e-5)
    same_sign = (token_adv * adv.unsqueeze(1)) >= 0
    assert bool(same_sign.all())


@given(seed=st.integers(0, 10_000), rho=st.floats(0.05, 1.0))
@SETTINGS
def test_batch_quantile_is_torch_quantile(seed: int, rho: float) -> None:
    gen = torch.Generator().manual_seed(seed)
    values = torch.randn(int(torch.randint(1, 60, (1,), generator=gen)), generator=gen)
    values[::3] = values[0]  # ties
    torch.testing.assert_close(batch_quantile(values, 1 - rho), torch.quantile(values, 1 - rho))


@given(seed=st.integers(0, 10_000), rho=st.sampled_from([0.1, 0.2, 0.5, 1.0]))
@SETTINGS
def test_entropy_top_mask_mode_is_trls_high_entropy_mask(seed: int, rho: float) -> None:
    adv, mask = random_batch(seed)
    entropy = torch.rand(mask.shape, generator=torch.Generator().manual_seed(seed + 1))
    entropy[:, ::2] = entropy[0, 0]  # ties at the threshold are kept
    strategy = get_strategy("entropy_top", rho=rho)
    result = assign_credit(
        strategy,
        adv,
        mask,
        torch.zeros_like(mask, dtype=torch.long),
        CreditSignals(token_entropy=entropy),
    )
    selected = trl_high_entropy_mask(entropy, mask, rho)
    expected = torch.where(selected, adv.unsqueeze(1).expand_as(mask), 0.0)
    torch.testing.assert_close(result.token_advantages, expected)


def test_entropy_top_selects_over_every_process_of_the_step() -> None:
    """The threshold is the quantile of both processes' entropies, not of this one's."""
    adv, mask = random_batch(3, B=4)
    _, other_mask = random_batch(4, B=4)
    gen = torch.Generator().manual_seed(5)
    mine, theirs = torch.rand(mask.shape, generator=gen), 3 * torch.rand(mask.shape, generator=gen)

    def gather(values: torch.Tensor) -> torch.Tensor:
        return torch.cat([values, theirs[other_mask]])

    strategy = get_strategy("entropy_top")
    ids = torch.zeros_like(mask, dtype=torch.long)
    got = assign_credit(strategy, adv, mask, ids, CreditSignals(token_entropy=mine), gather=gather)
    whole = trl_high_entropy_mask(torch.cat([mine, theirs]), torch.cat([mask, other_mask]), 0.2)
    expected = torch.where(whole[:4], adv.unsqueeze(1).expand_as(mask), 0.0)
    torch.testing.assert_close(got.token_advantages, expected)
    alone = assign_credit(strategy, adv, mask, ids, CreditSignals(token_entropy=mine))
    assert not torch.equal(alone.token_advantages, got.token_advantages)


@given(seed=st.integers(0, 10_000), rho=st.sampled_from([0.1, 0.2, 0.5]))
@SETTINGS
def test_entropy_top_weight_mode_keeps_sign_and_mean_and_falls_back_to_uniform(
    seed: int, rho: float
) -> None:
    adv, mask = random_batch(seed)
    entropy = torch.rand(mask.shape, generator=torch.Generator().manual_seed(seed + 1))
    entropy[1] = 0.0  # row 1 has no selected token
    result = assign_credit(
        get_strategy("entropy_top", rho=rho, mode="weight"),
        adv,
        mask,
        torch.zeros_like(mask, dtype=torch.long),
        CreditSignals(token_entropy=entropy),
    )
    token_adv = result.token_advantages
    assert_mean_keeping(adv, mask, token_adv)
    selected = trl_high_entropy_mask(entropy, mask, rho)
    n, k = mask.sum(dim=1), selected.sum(dim=1)
    for b in range(mask.shape[0]):
        if k[b] == 0:
            expected = torch.where(mask[b], adv[b], 0.0)
        else:
            expected = torch.where(selected[b], adv[b] * n[b] / k[b], 0.0)
        torch.testing.assert_close(token_adv[b], expected.float())
    assert result.diagnostics.uniform_fallbacks == int((k == 0).sum()) >= 1


def test_random_top_selects_the_share_and_its_stream_resumes_exactly() -> None:
    adv = torch.ones(64)
    mask = torch.ones(64, 50, dtype=torch.bool)
    ids = torch.zeros(64, 50, dtype=torch.long)
    strategy = get_strategy("random_top", rho=0.2, seed=7)
    first = strategy.assign(CreditBatch(adv, mask, ids))
    assert abs(float((first != 0).float().mean()) - 0.2) < 0.01
    state = strategy.state_dict()
    second = strategy.assign(CreditBatch(adv, mask, ids))
    assert not torch.equal(first, second)
    resumed = get_strategy("random_top", rho=0.2, seed=7)
    resumed.load_state_dict(state)
    assert torch.equal(resumed.assign(CreditBatch(adv, mask, ids)), second)
    with pytest.raises(CreditError, match="expected state keys"):
        resumed.load_state_dict({})


@given(seed=st.integers(0, 10_000), beta=st.floats(0.0, 1.0))
@SETTINGS
def test_abc_is_one_minus_beta_plus_beta_n_alpha_and_keeps_sign_and_mean(
    seed: int, beta: float
) -> None:
    adv, mask = random_batch(seed)
    gen = torch.Generator().manual_seed(seed + 1)
    raw = torch.where(mask, torch.rand(mask.shape, generator=gen), 0.0)
    raw[2] = 0.0  # no attention mass on the response
    alpha = raw / raw.sum(dim=1, keepdim=True).clamp_min(1e-30)
    result = assign_credit(
        get_strategy("abc", beta=beta),
        adv,
        mask,
        torch.zeros_like(mask, dtype=torch.long),
        CreditSignals(reward_attention=alpha),
    )
    assert_mean_keeping(adv, mask, result.token_advantages)
    n = mask.sum(dim=1, keepdim=True)
    w = (1 - beta) + beta * n * alpha
    uniform = (raw.sum(dim=1) == 0) | (n[:, 0] == 1)
    w = torch.where(uniform.unsqueeze(1), 1.0, w)
    expected = torch.where(mask, adv.unsqueeze(1) * w, 0.0)
    torch.testing.assert_close(result.token_advantages, expected.float(), atol=1e-6, rtol=1e-5)
    assert result.diagnostics.uniform_fallbacks == int(uniform.sum())


def test_abc_refuses_negative_or_non_finite_attention() -> None:
    adv, mask = torch.ones(1), torch.ones(1, 3, dtype=torch.bool)
    ids = torch.zeros(1, 3, dtype=torch.long)
    for bad in (torch.tensor([[0.5, 0.7, -0.2]]), torch.tensor([[0.5, float("nan"), 0.5]])):
        with pytest.raises(CreditError, match="reward_attention: expected finite values >= 0"):
            assign_credit(get_strategy("abc"), adv, mask, ids, CreditSignals(reward_attention=bad))


@given(seed=st.integers(0, 10_000))
@SETTINGS
def test_red_weights_tokens_by_their_aligned_prefix_reward(seed: int) -> None:
    adv, mask = random_batch(seed)
    gen = torch.Generator().manual_seed(seed + 1)
    r = torch.randn(mask.shape, generator=gen)
    r[3] = -torch.sign(adv[3]) * r[3].abs()  # every token opposes A: the floor gives uniform
    eps = 1e-3
    result = assign_credit(
        get_strategy("red", eps=eps),
        adv,
        mask,
        torch.zeros_like(mask, dtype=torch.long),
        CreditSignals(prefix_rewards=r),
    )
    assert_mean_keeping(adv, mask, result.token_advantages)
    raw = torch.where(mask, (torch.sign(adv).unsqueeze(1) * r).clamp_min(0) + eps, 0.0)
    w = raw * mask.sum(dim=1, keepdim=True) / raw.sum(dim=1, keepdim=True)
    torch.testing.assert_close(
        result.token_advantages, (adv.unsqueeze(1) * w).float(), atol=1e-6, rtol=1e-5
    )
    torch.testing.assert_close(result.token_advantages[3], torch.where(mask[3], adv[3], 0.0))
    assert result.diagnostics.uniform_fallbacks >= 1


@pytest.mark.parametrize(
    ("name", "signal"),
    [("entropy_top", "token_entropy"), ("abc", "reward_attention"), ("red", "prefix_rewards")],
)
def test_each_baseline_names_its_missing_signal_and_refuses_one_it_does_not_read(
    name: str, signal: str
) -> None:
    adv, mask = torch.ones(1), torch.ones(1, 3, dtype=torch.bool)
    ids = torch.zeros(1, 3, dtype=torch.long)
    with pytest.raises(CreditError, match=f"requires signal '{signal}'"):
        assign_credit(get_strategy(name), adv, mask, ids)
    values = torch.full((1, 3), 1 / 3)
    with pytest.raises(CreditError, match="does not read"):
        assign_credit(get_strategy("uniform"), adv, mask, ids, CreditSignals(**{signal: values}))


def test_non_finite_entropy_is_an_error_naming_the_rows() -> None:
    adv, mask = torch.ones(2), torch.ones(2, 3, dtype=torch.bool)
    entropy = torch.tensor([[0.1, 0.2, 0.3], [0.1, float("inf"), 0.3]])
    with pytest.raises(CreditError, match=r"entropy_top keys: .*rows \[1\]"):
        assign_credit(
            get_strategy("entropy_top"),
            adv,
            mask,
            torch.zeros(2, 3, dtype=torch.long),
            CreditSignals(token_entropy=entropy),
        )


@pytest.mark.parametrize("bad", [{"rho": 0.0}, {"rho": 1.5}, {"mode": "soft"}, {"rho": True}])
def test_top_fraction_parameters_are_validated(bad: dict[str, object]) -> None:
    with pytest.raises(CreditError):
        get_strategy("entropy_top", **bad)


def grouped_batch(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rewards (8,), GRPO advantages, mask (8, 7), groups (8,)): two groups of four."""
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.rand(8, generator=gen)
    _, mask = random_batch(seed, B=8, T=7)
    return rewards, group_advantages(rewards, 4), mask, torch.arange(8) // 4


@given(seed=st.integers(0, 10_000))
@SETTINGS
def test_red_paper_form_is_the_group_return_of_its_prefix_rewards(seed: int) -> None:
    rewards, adv, mask, groups = grouped_batch(seed)
    r = torch.randn(mask.shape, generator=torch.Generator().manual_seed(seed + 1))
    strategy = get_strategy("red", mode="paper")
    assert strategy.reads_groups and not get_strategy("red").reads_groups
    ids = torch.zeros_like(mask, dtype=torch.long)
    result = assign_credit(
        strategy, adv, mask, ids, CreditSignals(prefix_rewards=r), rewards=rewards, groups=groups
    )
    torch.testing.assert_close(result.token_advantages, group_return_advantages(r, mask, groups))


@given(seed=st.integers(0, 10_000), beta=st.floats(0.0, 1.0))
@SETTINGS
def test_abc_paper_form_rewards_beta_r_alpha_plus_the_terminal_reward(
    seed: int, beta: float
) -> None:
    rewards, adv, mask, groups = grouped_batch(seed)
    gen = torch.Generator().manual_seed(seed + 1)
    raw = torch.where(mask, torch.rand(mask.shape, generator=gen), 0.0)
    raw[5] = 0.0  # no attention mass: beta R spread evenly, counted
    alpha = raw / raw.sum(dim=1, keepdim=True).clamp_min(1e-30)
    result = assign_credit(
        get_strategy("abc", beta=beta, mode="paper"),
        adv,
        mask,
        torch.zeros_like(mask, dtype=torch.long),
        CreditSignals(reward_attention=alpha),
        rewards=rewards,
        groups=groups,
    )
    n = mask.sum(dim=1, keepdim=True)
    alpha = torch.where((raw.sum(1, keepdim=True) == 0) & mask, 1.0 / n, alpha)
    last = torch.zeros_like(mask)
    for b in range(8):
        last[b, int(torch.nonzero(mask[b]).max())] = True
    R = rewards.unsqueeze(1)
    token_rewards = beta * R * alpha + (1 - beta) * R * last
    expected = group_return_advantages(token_rewards, mask, groups)
    torch.testing.assert_close(result.token_advantages, expected, atol=1e-5, rtol=1e-5)
    assert result.diagnostics.uniform_fallbacks == 1
    if beta == 0.0:  # all reward at the end: plain GRPO on every token
        grpo = torch.where(mask, adv.unsqueeze(1), 0.0)
        torch.testing.assert_close(result.token_advantages, grpo, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("name", "signal"), [("abc", "reward_attention"), ("red", "prefix_rewards")]
)
def test_a_paper_form_without_groups_is_an_error_naming_them(name: str, signal: str) -> None:
    adv, mask = torch.ones(2), torch.ones(2, 3, dtype=torch.bool)
    values = torch.full((2, 3), 1 / 3)
    with pytest.raises(CreditError, match=r"reads the response rewards .* CreditBatch.rewards"):
        assign_credit(
            get_strategy(name, mode="paper"),
            adv,
            mask,
            torch.zeros(2, 3, dtype=torch.long),
            CreditSignals(**{signal: values}),
        )


# --- matched allocation (allocation: softmax_floor) and the paper route --------------------


def brute_force_softmax_floor(
    adv: torch.Tensor, mask: torch.Tensor, r: torch.Tensor, beta: float, lam: float
) -> torch.Tensor:
    """A_t = A w_t, w = (1 - lam) + lam n softmax(beta s / (rms s + 1e-8)) over each row's
    valid tokens, s = sign(A) r (docs/design.md, "From one advantage to many"), as loops."""
    out = torch.zeros(mask.shape, dtype=torch.float64)
    for b in range(mask.shape[0]):
        idx = [t for t in range(mask.shape[1]) if mask[b, t]]
        s = [float(torch.sign(adv[b])) * float(r[b, t]) for t in idx]
        rms = (sum(x * x for x in s) / len(s)) ** 0.5
        e = [torch.exp(torch.tensor(beta * x / (rms + 1e-8), dtype=torch.float64)) for x in s]
        for t, ex in zip(idx, e, strict=True):
            w = (1 - lam) + lam * len(idx) * float(ex) / float(sum(e))
            out[b, t] = float(adv[b]) * w
    return out


@pytest.mark.parametrize(
    ("name", "signal"), [("red", "prefix_rewards"), ("p2t", "reward_attribution")]
)
@given(seed=st.integers(0, 10_000), beta=st.floats(0.1, 4.0), lam=st.floats(0.0, 1.0))
@SETTINGS
def test_matched_allocation_is_datcs_allocation_of_the_signed_token_reward(
    name: str, signal: str, seed: int, beta: float, lam: float
) -> None:
    adv, mask = random_batch(seed)
    r = torch.randn(mask.shape, generator=torch.Generator().manual_seed(seed + 1))
    ids = torch.zeros_like(mask, dtype=torch.long)
    strategy = get_strategy(name, allocation="softmax_floor", beta=beta, lam=lam)
    result = assign_credit(strategy, adv, mask, ids, CreditSignals(**{signal: r}))
    # DATC with the same score (its W0 := r, so s = sign(A) r) allocates exactly alike
    datc = assign_credit(
        get_strategy("datc", beta=beta, lam=lam), adv, mask, ids, CreditSignals(unsigned_work=r)
    )
    assert torch.equal(result.token_advantages, datc.token_advantages)
    assert result.diagnostics == datc.diagnostics
    want = brute_force_softmax_floor(adv, mask, r, beta, lam)
    torch.testing.assert_close(result.token_advantages, want.float(), atol=1e-5, rtol=1e-5)
    assert_mean_keeping(adv, mask, result.token_advantages)


@pytest.mark.parametrize("name", ["red", "p2t"])
def test_today_s_mean_form_is_the_default_allocation(name: str) -> None:
    assert get_strategy(name).params.allocation == "aligned"
    assert get_strategy(name, mode="paper").params.paper_route == "group_returns"
    assert get_strategy("abc", mode="paper").params.paper_route == "group_returns"


@pytest.mark.parametrize("name", ["red", "p2t"])
@pytest.mark.parametrize(
    "unread",
    [
        {"beta": 2.0},
        {"lam": 0.3},
        {"allocation": "softmax_floor", "eps": 1e-3},
        {"paper_route": "step_norm"},
        {"mode": "paper", "allocation": "softmax_floor"},
        {"mode": "paper", "beta": 1.0},
    ],
)
def test_a_parameter_the_form_does_not_read_is_refused(
    name: str, unread: dict[str, object]
) -> None:
    with pytest.raises(CreditError, match="not read with mode"):
        get_strategy(name, **unread)


def test_abc_refuses_a_paper_route_in_mean_mode() -> None:
    with pytest.raises(CreditError, match="not read with mode 'mean'"):
        get_strategy("abc", paper_route="step_norm")


@pytest.mark.parametrize(
    ("name", "signal"),
    [("red", "prefix_rewards"), ("p2t", "reward_attribution"), ("abc", "reward_attention")],
)
@given(seed=st.integers(0, 10_000))
@SETTINGS
def test_paper_route_step_norm_is_the_step_normalised_advantage_of_the_same_rewards(
    name: str, signal: str, seed: int
) -> None:
    rewards, adv, mask, groups = grouped_batch(seed)
    values = torch.rand(mask.shape, generator=torch.Generator().manual_seed(seed + 1))
    values = torch.where(mask, values, 0.0)
    values = values / values.sum(dim=1, keepdim=True)  # a valid attention for abc as well
    ids = torch.zeros_like(mask, dtype=torch.long)
    kw = {"rewards": rewards, "groups": groups}
    signals = CreditSignals(**{signal: values})
    old = assign_credit(get_strategy(name, mode="paper"), adv, mask, ids, signals, **kw)
    new = get_strategy(name, mode="paper", paper_route="step_norm")
    got = assign_credit(new, adv, mask, ids, signals, **kw)
    assert old.token_rewards is not None
    want = group_step_advantages(old.token_rewards, mask, groups)
    torch.testing.assert_close(got.token_advantages, want)
    torch.testing.assert_close(got.token_rewards, old.token_rewards)
