"""The native trainer's PPO-with-a-critic formulas against verl's own code.

- ``gae_advantages_and_returns`` then ``whiten`` give verl's
  ``compute_gae_advantage_return`` (its advantages are whitened by ``masked_whiten``) on
  the valid tokens of right-padded responses, for several gamma and lambda;
- ``clipped_value_loss`` aggregated by token mean gives verl's ``compute_value_loss``
  (token-mean) and its clip fraction.
"""

from __future__ import annotations

import pytest

pytest.importorskip("verl", reason="the verl tests run in .venv-verl (make verl)")

import torch
from verl.trainer.ppo.core_algos import compute_gae_advantage_return, compute_value_loss

from backends.torch.gae import gae_advantages_and_returns, outcome_token_rewards, whiten
from backends.torch.loss import clipped_value_loss

LENGTHS = [9, 3, 1, 6, 9, 4]
T = 9


@pytest.fixture
def mask() -> torch.Tensor:
    return torch.arange(T).unsqueeze(0) < torch.tensor(LENGTHS).unsqueeze(1)


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 0.95), (1.0, 1.0), (0.97, 0.8)])
@pytest.mark.parametrize("dense", [False, True], ids=["outcome", "dense"])
def test_gae_and_whitening_equal_verls_on_right_padded_responses(
    mask: torch.Tensor, gamma: float, lam: float, dense: bool
) -> None:
    gen = torch.Generator().manual_seed(3)
    values = torch.randn(len(LENGTHS), T, generator=gen)
    if dense:
        rewards = torch.randn(len(LENGTHS), T, generator=gen) * mask
    else:
        rewards = outcome_token_rewards(torch.randn(len(LENGTHS), generator=gen), mask)
    want_adv, want_ret = compute_gae_advantage_return(
        rewards, values, mask.float(), torch.tensor(gamma), torch.tensor(lam)
    )
    adv, returns = gae_advantages_and_returns(rewards, values, mask, gamma=gamma, lam=lam)
    got_adv = whiten(adv, mask, lambda t: t)
    torch.testing.assert_close(got_adv[mask], want_adv[mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(returns[mask], want_ret[mask], atol=1e-5, rtol=1e-5)


def test_the_clipped_value_loss_equals_verls(mask: torch.Tensor) -> None:
    gen = torch.Generator().manual_seed(4)
    old = torch.randn(len(LENGTHS), T, generator=gen)
    new = old + torch.randn(len(LENGTHS), T, generator=gen)  # many beyond the clip
    returns = torch.randn(len(LENGTHS), T, generator=gen)
    want, want_frac = compute_value_loss(new, returns, old, mask.float(), cliprange_value=0.5)
    terms = clipped_value_loss(new, old, returns, clip=0.5)
    n = float(mask.sum())
    torch.testing.assert_close(terms.loss[mask].sum() / n, want, atol=1e-6, rtol=1e-6)
    assert float((terms.clipped & mask).sum()) / n == pytest.approx(float(want_frac), abs=1e-6)
    assert 0 < float(want_frac) < 1  # both branches occur
