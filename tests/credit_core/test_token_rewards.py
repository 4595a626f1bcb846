"""Token rewards to advantages (docs/design.md, "Token rewards to advantages").

A_t = (G_t - mean_g G_0) / (std_g G_0 + eps) with G_t the return-to-go of the row's valid
token rewards; a terminal-only reward gives GRPO's advantage on every token; a group whose
totals are all equal gives 0. The step-normalised route (DeepSeekMath's process supervision)
sums each token's reward normalised over its group's token rewards: checked on a hand-computed
example and against a loop; tokens of the group's mean reward add 0 wherever they sit.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from credit_core import CreditError, group_advantages
from credit_core.token_rewards import (
    group_return_advantages,
    group_step_advantages,
    returns_to_go,
)

pytestmark = pytest.mark.usefixtures("single_torch_thread")


def brute_force(r: torch.Tensor, mask: torch.Tensor, groups: list[int], eps: float) -> torch.Tensor:
    """The formula written out with Python loops, in float64."""
    B, T = r.shape
    G = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            if mask[b, t]:
                G[b, t] = sum(float(r[b, k]) for k in range(t, T) if mask[b, k])
    totals = [float(G[b][mask[b]][0]) for b in range(B)]
    out = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        members = [totals[i] for i in range(B) if groups[i] == groups[b]]
        mean = sum(members) / len(members)
        std = (sum((x - mean) ** 2 for x in members) / (len(members) - 1)) ** 0.5
        for t in range(T):
            if mask[b, t] and std > 0:
                out[b, t] = (G[b, t] - mean) / (std + eps)
    return out


def random_case(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    n_groups = int(torch.randint(1, 4, (1,), generator=gen))
    size = int(torch.randint(2, 5, (1,), generator=gen))
    B, T = n_groups * size, int(torch.randint(1, 8, (1,), generator=gen))
    groups = torch.randperm(B, generator=gen) % n_groups * 7 + 3  # arbitrary, not adjacent
    mask = torch.rand(B, T, generator=gen) < 0.7
    mask[torch.arange(B), torch.randint(0, T, (B,), generator=gen)] = True
    r = torch.randn(B, T, generator=gen, dtype=torch.float64)
    return r, mask, groups


@given(seed=st.integers(0, 10_000))
@settings(max_examples=60, deadline=None)
def test_advantages_are_the_group_baselined_returns_to_go(seed: int) -> None:
    r, mask, groups = random_case(seed)
    got = group_return_advantages(r, mask, groups)
    want = brute_force(r, mask, groups.tolist(), 1e-6)
    torch.testing.assert_close(got, want.to(torch.float32), atol=1e-5, rtol=1e-5)
    assert bool((got[~mask] == 0).all())


def test_returns_to_go_skip_padding_inside_a_row() -> None:
    r = torch.tensor([[1.0, 5.0, 2.0, 3.0]])
    mask = torch.tensor([[True, False, True, True]])
    torch.testing.assert_close(
        returns_to_go(r, mask), torch.tensor([[6.0, 0.0, 5.0, 3.0]], dtype=torch.float64)
    )


def test_a_terminal_reward_gives_grpo_on_every_token() -> None:
    gen = torch.Generator().manual_seed(0)
    rewards = torch.rand(12, generator=gen)
    mask = torch.ones(12, 6, dtype=torch.bool)
    mask[::3, 4:] = False
    last = torch.arange(6).expand(12, 6) == (mask.sum(1) - 1).unsqueeze(1)
    r = torch.where(last, rewards.unsqueeze(1), 0.0)
    groups = torch.arange(12) // 4
    adv = group_return_advantages(r, mask, groups)
    grpo = group_advantages(rewards, 4)
    torch.testing.assert_close(adv, torch.where(mask, grpo.unsqueeze(1), 0.0))


def test_a_group_whose_totals_are_equal_gets_zero_not_a_huge_advantage() -> None:
    r = torch.tensor([[1.0, -1.0], [0.0, 0.0], [3.0, 1.0], [1.0, 2.0]])
    mask = torch.ones(4, 2, dtype=torch.bool)
    groups = torch.tensor([0, 0, 1, 1])  # group 0: totals 0 and 0
    adv = group_return_advantages(r, mask, groups)
    assert bool((adv[:2] == 0).all())
    assert bool((adv[2:] != 0).any())


def test_bad_input_names_the_tensor() -> None:
    mask = torch.ones(3, 2, dtype=torch.bool)
    with pytest.raises(CreditError, match=r"groups .* have one"):
        group_return_advantages(torch.zeros(3, 2), mask, torch.tensor([0, 0, 1]))
    with pytest.raises(CreditError, match="token_rewards: expected finite"):
        group_return_advantages(
            torch.tensor([[float("nan"), 0.0]] * 2), mask[:2], torch.tensor([0, 0])
        )
    with pytest.raises(CreditError, match=r"groups: expected dtype torch\.int64"):
        group_return_advantages(torch.zeros(2, 2), mask[:2], torch.tensor([0.0, 0.0]))


# --- per-step normalisation (DeepSeekMath's process supervision) ---------------------------


def test_step_normalised_advantages_of_a_hand_computed_example() -> None:
    # group 7: token rewards {3, 0, 0, 0, 0, 3}: mean 1, Bessel var 12 / 5; group 9: {2, 0, 1}:
    # mean 1, var 1. r~ = (r - mean) / std, then summed to go over each row's valid tokens.
    r = torch.tensor([[3.0, 0.0, 0.0], [0.0, 0.0, 3.0], [2.0, 9.0, 9.0], [0.0, 1.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 0, 0], [1, 1, 0]], dtype=torch.bool)
    s = (12 / 5) ** 0.5
    want = torch.tensor(
        [[0.0, -2 / s, -1 / s], [0.0, 1 / s, 2 / s], [1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]]
    )
    got = group_step_advantages(r, mask, torch.tensor([7, 7, 9, 9]), eps=0.0)
    torch.testing.assert_close(got, want)


def brute_force_step_norm(
    r: torch.Tensor, mask: torch.Tensor, groups: list[int], eps: float
) -> torch.Tensor:
    """A_t = sum_{k >= t} (r_k - mean_g r) / (std_g r + eps) with Python loops, float64."""
    B, T = r.shape
    out = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        pool = [
            float(r[i, k])
            for i in range(B)
            if groups[i] == groups[b]
            for k in range(T)
            if mask[i, k]
        ]
        mean = sum(pool) / len(pool)
        std = (sum((x - mean) ** 2 for x in pool) / (len(pool) - 1)) ** 0.5
        for t in range(T):
            if mask[b, t] and std > 0:
                out[b, t] = sum(
                    (float(r[b, k]) - mean) / (std + eps) for k in range(t, T) if mask[b, k]
                )
    return out


@given(seed=st.integers(0, 10_000))
@settings(max_examples=60, deadline=None)
def test_step_normalised_advantages_are_the_formula(seed: int) -> None:
    r, mask, groups = random_case(seed)
    got = group_step_advantages(r, mask, groups)
    want = brute_force_step_norm(r, mask, groups.tolist(), 1e-6)
    torch.testing.assert_close(got, want.to(torch.float32), atol=1e-5, rtol=1e-5)
    assert bool((got[~mask] == 0).all())


def test_late_tokens_of_average_reward_get_zero_under_step_norm_negative_under_group_returns() -> (
    None
):
    # The better response (total 4 against 2) earns its surplus at token 0; its later tokens
    # hold the group's mean token reward (1). Their suffix return 2 falls below the group's
    # mean total 3 under group_returns; under step_norm they add exactly 0.
    r = torch.tensor([[2.0, 1.0, 1.0], [0.0, 1.0, 1.0]])
    mask, groups = torch.ones(2, 3, dtype=torch.bool), torch.tensor([0, 0])
    assert bool((group_return_advantages(r, mask, groups)[0, 1:] < 0).all())
    step = group_step_advantages(r, mask, groups)
    assert bool((step[:, 1:] == 0).all()) and float(step[0, 0]) > 0 > float(step[1, 0])


def test_step_norm_gives_zero_to_a_group_of_equal_token_rewards_and_checks_its_input() -> None:
    r = torch.tensor([[1.0, 1.0], [1.0, 1.0], [0.0, 2.0], [1.0, 2.0]])
    adv = group_step_advantages(r, torch.ones(4, 2, dtype=torch.bool), torch.tensor([0, 0, 1, 1]))
    assert bool((adv[:2] == 0).all()) and bool((adv[2:] != 0).any())
    mask = torch.ones(3, 2, dtype=torch.bool)
    with pytest.raises(CreditError, match=r"groups .* have one"):
        group_step_advantages(torch.zeros(3, 2), mask, torch.tensor([0, 0, 1]))
    with pytest.raises(CreditError, match="token_rewards: expected finite"):
        group_step_advantages(
            torch.tensor([[float("inf"), 0.0]] * 2), mask[:2], torch.tensor([0, 0])
        )
