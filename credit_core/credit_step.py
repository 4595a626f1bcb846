"""The credit step every backend calls: advantages + signals -> strategy -> token credit.

A backend computes the response advantages A (``group_advantages``) and only the signals the
strategy reads (``signals_to_compute``: ``requires``, or ``work_requires`` when the backend
knows the reward gradient first and streams DATC's unsigned work), then calls
``assign_credit``. Passing a signal the strategy does not read is an error here, not silent
waste; a missing one is an error naming it (``CreditBatch.require``). Rows without a valid
token are the core's to handle: the strategy sees only the others, and a process without any
still takes part in a gathering strategy's collective.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from credit_core.allocation import EMPTY_DIAGNOSTICS
from credit_core.batch import SIGNALS, TOKEN_SIGNALS, CreditBatch, Gather, PolicyStats
from credit_core.errors import CreditError
from credit_core.given_rewards import TokenRewards
from credit_core.strategy import CreditResult, CreditStrategy


@dataclass(frozen=True)
class CreditSignals:
    """The per-token signals of a batch of B responses of length T; None = not computed.

    - ``reward_grad`` (B, T, d): dR / d(RM input embedding), at policy response positions.
    - ``policy_stats``: ``PolicyStats`` (B, T[, d]) of the policy that sampled the batch.
    - ``unsigned_work`` (B, T): DATC's W0 (docs/design.md), streamed when g is known first.
    - ``token_entropy`` (B, T): the sampling policy's entropy per response position.
    - ``reward_attention`` (B, T): the direction model's attention over the response.
    - ``prefix_rewards`` (B, T): differences of the direction model's prefix scores.
    - ``reward_attribution`` (B, T): (e_t - e_null) . g_t, from the reward gradient (P2T).
    - ``implicit_log_ratio`` (B, T): log pi_phi - log pi_ref of the sampled tokens (PRIME).
    - ``answer_saliency`` (B, T): OAR-G's input-gradient saliency of the policy's own answer
      distribution at the reasoning tokens.
    - ``token_rewards``: ``TokenRewards`` (B, T), the rewards the user's reward function gives
      per token or per step; given, not computed, so not one of ``SIGNALS``: a strategy reads
      it by ``reads_token_rewards`` (the plan's feature ``token_rewards``).

    ``CreditBatch`` states each one's contract.
    """

    reward_grad: torch.Tensor | None = None
    policy_stats: PolicyStats | None = None
    unsigned_work: torch.Tensor | None = None
    token_entropy: torch.Tensor | None = None
    reward_attention: torch.Tensor | None = None
    prefix_rewards: torch.Tensor | None = None
    reward_attribution: torch.Tensor | None = None
    implicit_log_ratio: torch.Tensor | None = None
    answer_saliency: torch.Tensor | None = None
    token_rewards: TokenRewards | None = None

    @property
    def computed(self) -> frozenset[str]:
        """The names of the computed signals (``SIGNALS``) present."""
        return frozenset(name for name in SIGNALS if getattr(self, name) is not None)

    def select(self, rows: torch.Tensor | slice) -> CreditSignals:
        """The signals of a subset of responses (rows of the batch dimension)."""
        tokens = {
            name: None if getattr(self, name) is None else getattr(self, name)[rows]
            for name in TOKEN_SIGNALS
        }
        return CreditSignals(
            reward_grad=None if self.reward_grad is None else self.reward_grad[rows],
            policy_stats=None if self.policy_stats is None else self.policy_stats.select(rows),
            token_rewards=None if self.token_rewards is None else self.token_rewards.select(rows),
            **tokens,
        )


def assign_credit(
    strategy: CreditStrategy,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    token_ids: torch.Tensor,
    signals: CreditSignals | None = None,
    *,
    rewards: torch.Tensor | None = None,
    groups: torch.Tensor | None = None,
    gather: Gather | None = None,
    answer_mask: torch.Tensor | None = None,
) -> CreditResult:
    """Token advantages (B, T) float32 (0 where ``mask`` is False) and diagnostics.

    ``advantages`` (B,), ``mask`` (B, T) bool, ``token_ids`` (B, T) int64 and ``signals`` as
    ``CreditBatch`` validates them, except that a row may have no valid token: the strategy
    runs on the rows with one (``CreditBatch.select``) and the result is scattered into zeros
    (token advantages, and ``token_rewards`` when the strategy gives them); the diagnostics
    are those of the valid rows. Without any valid row the token advantages are 0 and the
    diagnostics ``EMPTY_DIAGNOSTICS``; a gathering strategy (``gathers``) does not run, but
    the process still calls ``gather`` once, with an empty float64 tensor, so that the
    other processes' collective completes. ``rewards`` (B,) and ``groups`` (B,) int64: the response
    rewards and the group of each response, which a strategy whose ``reads_groups`` needs (a
    backend passes them whenever it has them; they are context, not computed signals).
    ``gather``: how to reach the values of the step's other
    processes, for a strategy that selects tokens batch-wide (``CreditBatch.gather``); a
    backend whose step spans several processes passes it. Raises ``CreditError`` when
    ``signals`` holds a signal the strategy does not read (``strategy.signals_for``), or
    lacks one it needs. ``answer_mask`` (B, T) bool: each response's answer span (True at its
    final-answer tokens), context a task gives and a strategy whose ``reads_answer_span``
    needs. ``signals.token_rewards``: the user's token rewards, refused unless the strategy
    ``reads_token_rewards``.
    """
    signals = signals or CreditSignals()
    batch = CreditBatch(
        advantages=advantages,
        mask=mask,
        token_ids=token_ids,
        reward_grad=signals.reward_grad,
        policy_stats=signals.policy_stats,
        unsigned_work=signals.unsigned_work,
        token_entropy=signals.token_entropy,
        reward_attention=signals.reward_attention,
        prefix_rewards=signals.prefix_rewards,
        reward_attribution=signals.reward_attribution,
        implicit_log_ratio=signals.implicit_log_ratio,
        rewards=rewards,
        groups=groups,
        gather=gather,
        answer_saliency=signals.answer_saliency,
        answer_mask=answer_mask,
        token_rewards=signals.token_rewards,
        empty_rows=True,
    )
    reads = strategy.signals_for(batch)
    unread = sorted(signals.computed - reads)
    if unread:
        raise CreditError(
            f"strategy {strategy.name!r} does not read {unread}; a backend computes only the "
            f"signals the strategy reads ({sorted(reads)}; see signals_to_compute)"
        )
    if signals.token_rewards is not None and not type(strategy).reads_token_rewards:
        raise CreditError(
            f"strategy {strategy.name!r} does not read token rewards, but "
            "CreditSignals.token_rewards was given (the reward function returned rewards per "
            "token or per step): use a strategy that reads them (e.g. 'process')"
        )
    rows = mask.any(dim=1)
    if bool(rows.all()):
        return strategy.assign_with_diagnostics(batch)
    token_adv = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    if not bool(rows.any()):
        if gather is not None and strategy.gathers:
            gather(torch.zeros(0, dtype=torch.float64, device=mask.device))
        return CreditResult(token_adv, EMPTY_DIAGNOSTICS, _empty_token_rewards(strategy, mask))
    result = strategy.assign_with_diagnostics(batch.select(rows))
    token_adv[rows] = result.token_advantages
    token_rewards = None
    if result.token_rewards is not None:
        token_rewards = result.token_rewards.new_zeros(mask.shape)
        token_rewards[rows] = result.token_rewards
    return CreditResult(token_adv, result.diagnostics, token_rewards)


def _empty_token_rewards(strategy: CreditStrategy, mask: torch.Tensor) -> torch.Tensor | None:
    """The token rewards (B, T) float64 zeros of a batch without a valid token, for a strategy
    whose result carries them (``critic_reward_form == "token_rewards"``); None otherwise."""
    if strategy.critic_reward_form != "token_rewards":
        return None
    return torch.zeros(mask.shape, dtype=torch.float64, device=mask.device)
