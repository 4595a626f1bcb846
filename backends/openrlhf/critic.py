"""PPO with a critic under OpenRLHF (``--algo.advantage.estimator gae``): the strategy's
credit as a shift D of OpenRLHF's token rewards (docs/design.md, "Credit under a critic").

OpenRLHF's ``compute_advantages_and_returns`` builds each micro-batch's token rewards with
``compute_reward`` (the clipped outcome reward r_i at the last action token, plus
-kl_coef KL_t on every token when the KL is in the reward) and hands them to
``get_advantages_and_returns`` (GAE on the critic's values), then whitens the advantages
over the step. ``critic_reward_shifts`` gives the D of every micro-batch of a step, which
the token-credit maker adds to the token rewards as they enter ``get_advantages_and_returns``;
OpenRLHF's reward construction, GAE, whitening and critic run unchanged.

The strategy runs exactly as under GRPO: on GRPO's ``group_norm`` response advantages of the
same rollouts, A_i = (r_i - mean_g r) / (std_g r + 1e-9) (OpenRLHF's own ``group_norm``),
the groups being each prompt's ``--rollout.n_samples_per_prompt`` samples (``Experience.index``
// n), with the signals gathered as under GRPO. A strategy that selects across the step
(``gathers``) or reads the rewards and groups (``reads_groups``: the paper forms) sees the
whole step as one batch of per-token signals; any other one micro-batch at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from backends.openrlhf.actor_side import ActorSignals
from backends.openrlhf.layout import action_token_ids
from backends.openrlhf.step_batch import outcome_rewards, step_batch, step_groups
from credit_core import CreditDiagnostics, CreditError, CreditStrategy, assign_credit
from credit_core.advantages import group_advantages
from credit_core.allocation import UNIFORM_DIAGNOSTICS
from credit_core.strategy import CreditResult
from credit_core.token_rewards import critic_reward_shift

#: OpenRLHF's ``group_norm``: (r - mean) / (std + 1e-9).
GROUP_NORM_EPS = 1e-9


@dataclass(frozen=True)
class CriticShifts:
    """What the strategy's credit adds to a step's token rewards.

    - ``shifts``: one (B_k, A_k) float32 tensor per micro-batch, on its action columns, 0
      off the action tokens; each response's sum is 0 for a ``weights`` strategy.
    - ``diagnostics``: the strategy's weight diagnostics of each micro-batch (the step's,
      repeated, for a strategy that sees the whole step).
    """

    shifts: list[torch.Tensor]
    diagnostics: list[CreditDiagnostics]


def grpo_advantages(rewards: torch.Tensor, groups: torch.Tensor, n: int) -> torch.Tensor:
    """(N,) float32: GRPO's ``group_norm`` advantage of each response (OpenRLHF's formula)."""
    order = torch.argsort(groups, stable=True)
    out = torch.empty_like(rewards)
    out[order] = group_advantages(rewards[order], n, "group_norm", eps=GROUP_NORM_EPS)
    return out


def critic_reward_shifts(
    experiences: Sequence[Any],
    strategy: CreditStrategy,
    signals: Iterable[ActorSignals],
    *,
    n_samples_per_prompt: int,
    clip_range: Sequence[float] | None,
) -> CriticShifts:
    """The shift D of each micro-batch's token rewards (module docstring).

    ``experiences``: the step's micro-batches, after OpenRLHF's length penalties, with
    ``action_mask`` (B_k, A_k), ``sequences``, ``rewards`` (B_k,) and ``index``; ``signals``
    one per micro-batch, in order (taken one at a time). ``CreditError`` when a group has
    fewer than 2 responses or the strategy has no ``critic_reward_form``.
    """
    form = strategy.critic_reward_form
    if form is None:
        raise CreditError(
            f"credit strategy {strategy.name!r} has no token-reward form for a critic "
            "(docs/design.md, 'Credit under a critic')"
        )
    rewards = outcome_rewards(experiences, clip_range)
    groups = step_groups(experiences, n_samples_per_prompt)
    advantages = grpo_advantages(rewards, groups, n_samples_per_prompt)
    step = step_batch(experiences)
    mask = step.mask
    token_advantages = torch.zeros(mask.shape, dtype=torch.float32)
    # the paper form's own r_t (0 for rows without an action token); None until a result
    # carries them, so a paper-form strategy that returns none is refused by the shift
    token_rewards: torch.Tensor | None = None
    if strategy.gathers or strategy.reads_groups:
        credits = [s.credit() for s in signals]
        result = step.assign(strategy, advantages, credits, rewards, groups)
        token_rewards = _place(token_advantages, token_rewards, step.rows, result)
        diagnostics = [result.diagnostics] * len(experiences)
    else:
        diagnostics = []
        start = 0
        for experience, signal in zip(experiences, signals, strict=True):
            acts = experience.action_mask.bool()
            local = torch.nonzero(acts.any(dim=1)).flatten()
            rows = local + start
            start += acts.shape[0]
            if local.numel() == 0:  # no action token: nothing to credit, D = 0
                diagnostics.append(UNIFORM_DIAGNOSTICS)
                continue
            result = assign_credit(
                strategy,
                advantages[rows],
                acts[local],
                action_token_ids(experience.sequences, experience.action_mask)[local],
                signal.credit().select(local),
            )
            token_rewards = _place(token_advantages, token_rewards, rows, result)
            diagnostics.append(result.diagnostics)
    credit = CreditResult(token_advantages, diagnostics[0], token_rewards)
    shift = critic_reward_shift(credit, advantages, rewards, groups, mask, form, name=strategy.name)
    return CriticShifts(step.split(shift), diagnostics)


def _place(
    token_advantages: torch.Tensor,
    token_rewards: torch.Tensor | None,
    rows: torch.Tensor,
    result: CreditResult,
) -> torch.Tensor | None:
    """Write ``result`` (n, A') into ``rows`` of the step's (N, W) ``token_advantages`` and,
    when it carries token rewards, of ``token_rewards`` (created at the first such result);
    return ``token_rewards``."""
    cols = result.token_advantages.shape[1]
    token_advantages[rows, :cols] = result.token_advantages.to(torch.float32)
    if result.token_rewards is None:
        return token_rewards
    if token_rewards is None:
        token_rewards = torch.zeros(token_advantages.shape, dtype=torch.float64)
    token_rewards[rows, :cols] = result.token_rewards.to(torch.float64)
    return token_rewards
