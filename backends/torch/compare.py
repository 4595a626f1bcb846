"""Other credit strategies on a run's own batches: the credit each would give, at the same policy.

``compare_credit`` pairs a strategy with the reward side it needs: the run's reward without
the run strategy's path gradient, wrapped again with the strategy's own
``reward_grad_points`` (``datc_mid``, ``datc_ig``). ``GRPORecipe.signals(batch, pool,
strategy=c.strategy, rewards=c.reward)`` then gives its token advantages through the one
credit path. Used by the credit samples (``backends.torch.credit_samples``) and the
ablation's credit probes.
"""

from __future__ import annotations

from dataclasses import dataclass

from adapters.grad_path import HandedExpectedEmbeddings, with_grad_path, without_grad_path
from backends.torch.rollout_rewards import RolloutRewards
from credit_core import CreditConfig, CreditStrategy, get_strategy


@dataclass(frozen=True)
class CompareCredit:
    """A credit to compute on another run's batches: its label, strategy and reward side."""

    label: str
    strategy: CreditStrategy
    reward: RolloutRewards


def compare_credit(
    label: str,
    credit: CreditConfig,
    reward: RolloutRewards,
) -> CompareCredit:
    """``credit`` with ``reward`` (the run's reward side), its direction gradient taken where
    the strategy reads it: for a strategy with ``reward_grad_points``, on the path to the
    m1 handed over by the old-policy pass of ``GRPORecipe.signals``."""
    strategy = get_strategy(credit)
    signals = without_grad_path(reward.signals)
    if strategy.reward_grad_points:
        signals = with_grad_path(signals, strategy.reward_grad_points, HandedExpectedEmbeddings())
    return CompareCredit(label, strategy, RolloutRewards(signals))
