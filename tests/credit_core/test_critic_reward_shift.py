"""Credit under a critic (docs/design.md, "Credit under a critic"): a strategy's credit
becomes a shift D of the outcome token rewards R_i 1[t = T_i] that PPO's GAE reads.

Weight form: D_t = (R_i - mean_g R) (w_t - 1) / n_i, sum_t D_t = 0, uniform adds exactly 0.
Paper form: D_t = r_t - R_i 1[t = T_i].
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from credit_core import CreditError, CreditSignals, assign_credit, get_strategy, group_advantages
from credit_core.strategy import CreditResult
from credit_core.token_rewards import critic_reward_shift

pytestmark = pytest.mark.usefixtures("single_torch_thread")


def _rollout(seed: int, B: int = 6, T: int = 7) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    rewards = torch.rand(B, generator=g, dtype=torch.float64).float()
    groups = torch.arange(B) // 3
    ids = torch.randint(0, 11, (B, T), generator=g)
    return mask, rewards, groups, ids


def _brute_weights(result: CreditResult, adv: torch.Tensor, rewards, groups, mask) -> torch.Tensor:
    """The weight-form formula with Python loops, float64."""
    B, T = mask.shape
    out = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        members = [float(rewards[i]) for i in range(B) if groups[i] == groups[b]]
        dev = float(rewards[b]) - sum(members) / len(members)
        n = int(mask[b].sum())
        for t in range(n):
            w = float(result.token_advantages[b, t]) / float(adv[b]) if adv[b] != 0 else 1.0
            out[b, t] = dev * (w - 1.0) / n
    return out


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), rho=st.floats(0.1, 0.9))
def test_weight_form_matches_the_formula_and_keeps_each_response_total(
    seed: int, rho: float
) -> None:
    mask, rewards, groups, ids = _rollout(seed)
    adv = group_advantages(rewards, 3, "group_norm")
    strategy = get_strategy("random_top", rho=rho, mode="weight", seed=seed)
    result = assign_credit(strategy, adv, mask, ids)
    shift = critic_reward_shift(result, adv, rewards, groups, mask, "weights")
    expected = _brute_weights(result, adv, rewards, groups, mask)
    torch.testing.assert_close(shift.double(), expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(
        shift.double().sum(dim=1), torch.zeros(6, dtype=torch.float64), atol=1e-6, rtol=0
    )
    assert bool((shift[~mask] == 0).all())


def test_uniform_adds_exactly_zero_so_the_outcome_rewards_stay_bitwise_stock() -> None:
    mask, rewards, groups, ids = _rollout(3)
    adv = group_advantages(rewards, 3, "group_norm")
    result = assign_credit(get_strategy("uniform"), adv, mask, ids)
    shift = critic_reward_shift(result, adv, rewards, groups, mask, "weights")
    assert bool((shift == 0).all())
    stock = torch.zeros(mask.shape).scatter(1, (mask.sum(1) - 1).unsqueeze(1), rewards.unsqueeze(1))
    assert torch.equal(stock + shift, stock)


def test_a_good_response_moves_reward_to_its_upweighted_tokens_a_bad_one_blame() -> None:
    mask = torch.ones(2, 4, dtype=torch.bool)
    rewards = torch.tensor([1.0, 0.0])
    groups = torch.tensor([0, 0])
    adv = group_advantages(rewards, 2, "group_norm")
    w = torch.tensor([[2.0, 1.0, 0.5, 0.5], [0.5, 0.5, 1.0, 2.0]], dtype=torch.float64)
    result = CreditResult((adv.double().unsqueeze(1) * w).float(), None)  # type: ignore[arg-type]
    shift = critic_reward_shift(result, adv, rewards, groups, mask, "weights")
    # deviations +0.5 and -0.5, n = 4: D = +-0.5 (w - 1) / 4
    torch.testing.assert_close(shift[0], torch.tensor([0.125, 0.0, -0.0625, -0.0625]))
    torch.testing.assert_close(shift[1], torch.tensor([0.0625, 0.0625, 0.0, -0.125]))


def test_paper_form_replaces_the_outcome_reward_with_its_token_rewards() -> None:
    mask = torch.tensor([[True, True, True], [True, True, False]])
    rewards = torch.tensor([1.0, 0.0])
    groups = torch.tensor([0, 0])
    adv = group_advantages(rewards, 2, "group_norm")
    alpha = torch.tensor([[0.5, 0.25, 0.25], [1.0, 0.0, 0.0]])
    strategy = get_strategy("abc", beta=0.5, mode="paper")
    result = assign_credit(
        strategy,
        adv,
        mask,
        torch.zeros(2, 3, dtype=torch.long),
        CreditSignals(reward_attention=alpha),
        rewards=rewards,
        groups=groups,
    )
    shift = critic_reward_shift(result, adv, rewards, groups, mask, "token_rewards")
    # ABC's r_t = beta R alpha_t + (1 - beta) R 1[t = T]; minus R at T
    torch.testing.assert_close(shift[0], torch.tensor([0.25, 0.125, 0.125 + 0.5 - 1.0]))
    torch.testing.assert_close(shift[1], torch.zeros(3))


def test_a_weights_strategy_that_changes_a_mean_is_refused_naming_the_rows() -> None:
    mask, rewards, groups, ids = _rollout(5)
    adv = group_advantages(rewards, 3, "group_norm")
    result = assign_credit(get_strategy("random_top", rho=0.3, mode="mask"), adv, mask, ids)
    with pytest.raises(CreditError, match=r"random_top: .*'weights'.*change the mean of rows"):
        critic_reward_shift(result, adv, rewards, groups, mask, "weights", name="random_top")


def test_paper_form_without_token_rewards_and_lone_groups_are_refused() -> None:
    mask, rewards, groups, ids = _rollout(1)
    adv = group_advantages(rewards, 3, "group_norm")
    result = assign_credit(get_strategy("uniform"), adv, mask, ids)
    with pytest.raises(CreditError, match=r"CreditResult.token_rewards"):
        critic_reward_shift(result, adv, rewards, groups, mask, "token_rewards")
    with pytest.raises(CreditError, match=r"groups: .*>= 2 responses per group"):
        critic_reward_shift(result, adv, rewards, torch.arange(6), mask, "weights")


def test_which_strategies_declare_which_form() -> None:
    forms = {
        "uniform": "weights",
        "datc": "weights",
        "p2t": "weights",
        "oar_g": "weights",
        "ktae": None,
        "prime": None,
        "entropy_top": None,
        "process": "token_rewards",
    }
    for name, form in forms.items():
        assert get_strategy(name).critic_reward_form == form, name
    assert get_strategy("red", mode="paper").critic_reward_form == "token_rewards"
    assert get_strategy("entropy_top", mode="weight").critic_reward_form == "weights"
