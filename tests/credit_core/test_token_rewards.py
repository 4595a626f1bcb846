"""Token rewards to advantages (docs/design.md, "Token rewards to advantages").

A_t = (G_t - mean_g G_0) / (std_g G_0 + eps) with G_t the return-to-go of the row's valid
token rewards; a terminal-only reward gives GRPO's advantage on every token; a group whose
totals are all equal gives 0.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from credit_core import CreditError, group_advantages
from credit_core.token_rewards import group_return_advantages, returns_to_go

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
