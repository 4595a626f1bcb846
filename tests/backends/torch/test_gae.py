"""PPO's GAE, whitening and clipped value loss (docs/design.md, "PPO with a critic (GAE)").

Checked against a brute-force loop over each response's valid tokens that applies the
textbook definitions literally (A_t = sum_l (gamma lam)^l delta_{t+l}, V_T = 0);
tests/backends/verl/test_gae.py checks the same functions against verl's own code.
"""

from __future__ import annotations

import pytest
import torch

from backends.torch.gae import (
    WHITEN_EPS,
    ReduceSum,
    gae_advantages_and_returns,
    outcome_token_rewards,
    whiten,
)
from backends.torch.loss import clipped_value_loss
from credit_core import CreditError


def right_padded(lengths: list[int], T: int) -> torch.Tensor:
    return torch.arange(T).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)


def brute_force_gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    adv = torch.zeros(rewards.shape, dtype=torch.float64)
    for i in range(rewards.shape[0]):
        n = int(mask[i].sum())
        v = [float(values[i, t]) for t in range(n)] + [0.0]
        delta = [float(rewards[i, t]) + gamma * v[t + 1] - v[t] for t in range(n)]
        for t in range(n):
            adv[i, t] = sum((gamma * lam) ** k * delta[t + k] for k in range(n - t))
    returns = torch.where(mask, adv + values.double(), 0.0)
    return adv, returns


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 0.95), (1.0, 1.0), (0.9, 0.0), (0.99, 0.5)])
def test_gae_equals_the_textbook_sum_over_each_responses_valid_tokens(
    gamma: float, lam: float
) -> None:
    gen = torch.Generator().manual_seed(0)
    lengths, T = [7, 1, 4, 7, 2], 7
    mask = right_padded(lengths, T)
    rewards = torch.randn(len(lengths), T, generator=gen)  # dense, to test every delta
    values = torch.randn(len(lengths), T, generator=gen)  # garbage at padding: ignored
    adv, returns = gae_advantages_and_returns(rewards, values, mask, gamma=gamma, lam=lam)
    want_adv, want_ret = brute_force_gae(rewards, values, mask, gamma, lam)
    torch.testing.assert_close(adv.double(), want_adv, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(returns.double(), want_ret, atol=1e-5, rtol=1e-5)
    assert bool((adv[~mask] == 0).all()) and bool((returns[~mask] == 0).all())


def test_with_gamma_and_lambda_1_the_advantage_is_the_outcome_minus_the_value() -> None:
    mask = right_padded([3, 2], 4)
    rewards = outcome_token_rewards(torch.tensor([1.0, -2.0]), mask)
    values = torch.tensor([[0.1, 0.2, 0.3, 9.0], [0.5, -0.5, 9.0, 9.0]])
    adv, returns = gae_advantages_and_returns(rewards, values, mask, gamma=1.0, lam=1.0)
    torch.testing.assert_close(adv, torch.tensor([[0.9, 0.8, 0.7, 0], [-2.5, -1.5, 0, 0]]))
    torch.testing.assert_close(returns, torch.tensor([[1.0, 1, 1, 0], [-2, -2, 0, 0]]))


def test_the_outcome_reward_sits_on_each_responses_last_valid_token() -> None:
    mask = right_padded([3, 1, 4], 4)
    got = outcome_token_rewards(torch.tensor([0.5, -1.0, 2.0]), mask)
    want = torch.tensor([[0, 0, 0.5, 0], [-1.0, 0, 0, 0], [0, 0, 0, 2.0]])
    assert torch.equal(got, want)


def test_a_mask_with_a_valid_token_after_padding_is_refused() -> None:
    mask = torch.tensor([[True, False, True], [True, True, False]])
    x = torch.zeros(2, 3)
    with pytest.raises(CreditError, match=r"mask: expected right-padded rows .* rows \[0\]"):
        gae_advantages_and_returns(x, x, mask, gamma=1.0, lam=0.95)
    with pytest.raises(CreditError, match="right-padded"):
        outcome_token_rewards(torch.zeros(2), mask)
    with pytest.raises(CreditError, match=r"rows \[1\] have no valid token"):
        outcome_token_rewards(torch.zeros(2), right_padded([2, 0], 3))
    with pytest.raises(CreditError, match=r"lam: expected a value in \[0, 1\]"):
        gae_advantages_and_returns(x, x, right_padded([2, 3], 3), gamma=1.0, lam=1.5)


def test_whitening_uses_the_mean_and_unbiased_variance_of_all_ranks_valid_tokens() -> None:
    gen = torch.Generator().manual_seed(1)
    adv = torch.randn(6, 5, generator=gen)
    mask = right_padded([5, 2, 3, 1, 5, 4], 5)
    valid = adv[mask].double()
    want = (adv.double() - valid.mean()) / (valid.var(unbiased=True) + WHITEN_EPS).sqrt()
    got = whiten(adv, mask, lambda t: t)
    torch.testing.assert_close(got[mask].double(), want[mask], atol=1e-6, rtol=1e-6)
    assert bool((got[~mask] == 0).all())
    # two "ranks" holding rows 0-2 and 3-5: each one's sums plus the other's give the
    # one-process result (the other rank's second sum is taken about the global mean)
    halves = [(adv[:3].double(), mask[:3].double()), (adv[3:].double(), mask[3:].double())]

    def with_rank(other: int) -> ReduceSum:
        a, m = halves[other]
        first = torch.stack([(a * m).sum(), m.sum()])
        second = (((a - valid.mean()) * m) ** 2).sum().reshape(1)
        return lambda t: t + (first if t.numel() == 2 else second)

    parts = [whiten(adv[:3], mask[:3], with_rank(1)), whiten(adv[3:], mask[3:], with_rank(0))]
    torch.testing.assert_close(torch.cat(parts), got, atol=1e-6, rtol=1e-6)


def test_whitening_fewer_than_two_tokens_is_refused() -> None:
    with pytest.raises(CreditError, match="at least 2 valid tokens"):
        whiten(torch.ones(1, 3), right_padded([1], 3), lambda t: t)


# ------------------------------------------------------------------------ value loss


def test_the_value_loss_is_half_the_larger_of_the_plain_and_the_clipped_squared_error() -> None:
    old = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    new = torch.tensor([[0.1, 1.0, -1.0, 1.2]], requires_grad=True)
    ret = torch.tensor([[0.0, 2.0, 0.0, 1.0]])
    terms = clipped_value_loss(new, old, ret, clip=0.5)
    # token 0: inside the clip; 1: clipped to 0.5, error 1.5 > 1.0, the clipped one counts;
    # 2: clipped to -0.5, error 0.5 < 1.0, the plain one counts; 3: inside
    want = 0.5 * torch.tensor([[0.01, 1.5**2, 1.0, 0.04]])
    torch.testing.assert_close(terms.loss, want)
    assert terms.clipped.tolist() == [[False, True, False, False]]
    terms.loss.sum().backward()
    assert new.grad is not None
    # the clipped error is constant in the new value: no gradient where it is active
    torch.testing.assert_close(new.grad, torch.tensor([[0.1, 0.0, -1.0, 0.2]]))


def test_value_loss_shapes_and_clip_are_checked() -> None:
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"returns: expected shape \(2, 3\)"):
        clipped_value_loss(x, x, torch.zeros(2, 2), clip=0.5)
    with pytest.raises(ValueError, match="clip: expected a value > 0"):
        clipped_value_loss(x, x, x, clip=0.0)
