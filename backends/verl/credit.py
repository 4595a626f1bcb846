"""The credit step of the verl backend: verl's advantages (or token rewards) + signals ->
token credit.

Under GRPO verl's trainer writes the advantages as a (B, T) tensor, the response advantage
A_i broadcast over the row's response mask (``compute_grpo_outcome_advantage``:
``scores.unsqueeze(-1) * response_mask``). ``token_advantages`` reads A_i back from that
tensor and hands it, with the signals the strategy reads (and the response rewards and
groups where the strategy reads them), to the one shared ``credit_core.assign_credit``;
``credit: uniform`` gives back verl's tensor bit for bit (A_i * 1 at the mask, 0 elsewhere).
``credit_fields`` does the same on the nested TransferQueue fields that verl's V1 trainer
stores (``response_from_nested`` layout).

Under verl's critic estimator (GAE) ``critic_shift_fields`` runs the strategy the same way
on GRPO's response advantages of the same rollouts (verl's own
``compute_grpo_outcome_advantage`` of the scores within each prompt's samples) and returns
``credit_core.token_rewards.critic_reward_shift``'s D, which the trainer adds to verl's
token rewards before verl's own GAE (docs/design.md, "Credit under a critic").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
from verl.workers.utils.padding import response_from_nested, response_to_nested

from backends.verl.config import SIGNAL_FIELDS
from credit_core import CreditDiagnostics, CreditError, CreditSignals, CreditStrategy, assign_credit
from credit_core.plan import CreditPlan
from credit_core.strategy import CreditResult
from credit_core.token_rewards import critic_reward_shift

#: The TransferQueue fields of the response rewards (verl's token-level scores, the reward
#: at each response's last token) and of each response's prompt id (verl's group).
REWARD_FIELDS = ("rm_scores", "uid")


def response_advantages(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A (B,) from verl's (B, T) advantages: each row's value at its first valid token (0 for
    a row without one). ``CreditError`` when a row's advantage varies over its valid tokens
    (not a response-level estimator: the credit spreads one advantage per response)."""
    first = mask.int().argmax(dim=1)
    rows = torch.arange(mask.shape[0], device=mask.device)
    A = torch.where(mask.any(dim=1), advantages[rows, first], torch.zeros_like(advantages[:, 0]))
    if not bool(torch.where(mask, advantages == A.unsqueeze(1), True).all()):
        raise CreditError(
            "algorithm.adv_estimator: the advantages vary within a response; the credit "
            "strategies spread one response-level (GRPO) advantage over the tokens"
        )
    return A


@dataclass(frozen=True)
class RewardGroups:
    """The response rewards R (B,) float32 (verl's scores summed over the response, as its
    GRPO sums ``token_level_rewards``) and each response's group (B,) int64 (the index of
    its prompt's ``uid`` among the batch's sorted uids)."""

    rewards: torch.Tensor
    groups: torch.Tensor

    def select(self, rows: torch.Tensor) -> RewardGroups:
        """The rewards and groups of ``rows`` (B,) bool."""
        return RewardGroups(self.rewards[rows], self.groups[rows])


def reward_groups(scores: torch.Tensor, uid: object) -> RewardGroups:
    """``RewardGroups`` from verl's padded token-level ``scores`` (B, T) and its ``uid``
    field (anything with ``tolist()``: strings or numbers, one per row)."""
    ids = [str(u) for u in uid.tolist()]  # type: ignore[attr-defined]
    if len(ids) != scores.shape[0]:
        raise CreditError(f"uid: expected {scores.shape[0]} ids (one per response), got {len(ids)}")
    _, index = np.unique(np.array(ids, dtype=object), return_inverse=True)
    groups = torch.as_tensor(index.astype(np.int64), device=scores.device)
    return RewardGroups(scores.float().sum(dim=-1), groups)


def token_credit(
    strategy: CreditStrategy,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    token_ids: torch.Tensor,
    signals: CreditSignals,
    context: RewardGroups | None = None,
) -> tuple[CreditResult | None, torch.Tensor]:
    """``assign_credit`` of ``strategy`` on the rows of ``mask`` (B, T) bool with a valid
    token, from verl's (B, T) ``advantages`` (A_i broadcast), the response ``token_ids``,
    ``signals`` and, when given, the response rewards and groups; with the rows it ran on
    (B,) bool. None when no row has a valid token."""
    A = response_advantages(advantages, mask)
    rows = mask.any(dim=1)
    if not bool(rows.any()):
        return None, rows
    every = bool(rows.all())
    picked = None if context is None else context if every else context.select(rows)
    result = assign_credit(
        strategy,
        A if every else A[rows],
        mask if every else mask[rows],
        token_ids.long() if every else token_ids[rows].long(),
        signals if every else signals.select(rows),
        rewards=None if picked is None else picked.rewards,
        groups=None if picked is None else picked.groups,
    )
    return result, rows


def token_advantages(
    strategy: CreditStrategy,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    token_ids: torch.Tensor,
    signals: CreditSignals,
    context: RewardGroups | None = None,
) -> tuple[torch.Tensor, CreditDiagnostics | None]:
    """Token advantages (B, T) float32 of ``strategy`` from verl's (B, T) ``advantages``,
    ``mask`` (B, T) bool, the response ``token_ids``, ``signals`` and (for a strategy that
    reads them) the response rewards and groups: 0 where ``mask`` is False and at rows
    without a valid token; the diagnostics (None without a valid row)."""
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    result, rows = token_credit(strategy, advantages, mask, token_ids, signals, context)
    if result is None:
        return out, None
    out[rows] = result.token_advantages
    return out, result.diagnostics


@dataclass(frozen=True)
class PaddedInputs:
    """The credit step's inputs from a batch's TransferQueue fields, padded to (B, T):
    ``fields`` (``response_mask``, ``responses``, the signals' fields, and ``advantages`` /
    ``rm_scores`` where read), the ``mask`` (B, T) bool, the ``signals`` and the response
    rewards and groups (``context``, None unless read)."""

    fields: TensorDict
    mask: torch.Tensor
    signals: CreditSignals
    context: RewardGroups | None


def fields_read(plan: CreditPlan, critic: bool) -> list[str]:
    """The TransferQueue fields the credit step reads for ``plan`` (``critic``: under the
    critic estimator, where verl's advantages are not GRPO's: the rewards and groups are)."""
    names = ["response_mask", "responses"]
    names += [SIGNAL_FIELDS[s] for s in sorted(plan.signals) if s in SIGNAL_FIELDS]
    if "token_entropy" in plan.signals:
        names.append("entropy")
    if not critic:
        names.append("advantages")
    if critic or plan.reads_groups:
        names += REWARD_FIELDS
    return names


def padded_inputs(plan: CreditPlan, fields: TensorDict, critic: bool = False) -> PaddedInputs:
    """``PaddedInputs`` of ``plan`` from the nested TransferQueue ``fields`` (the
    ``fields_read``): each engine signal's field (the engine's prompt + response layout)
    cut to the response, verl's ``entropy`` as it is (response layout)."""
    response_mask = fields["response_mask"]
    found = {}
    for signal in sorted(plan.signals):
        if signal in SIGNAL_FIELDS:
            field = SIGNAL_FIELDS[signal]
            if field not in fields:
                raise CreditError(
                    f"algorithm.credit: the actor engine gave no {field}; is the plugin "
                    "backends.verl.plugin loaded in the worker processes (its verl.plugins "
                    "entry point, or VERL_USE_EXTERNAL_MODULES=backends.verl.plugin)?"
                )
            found[signal] = response_from_nested(fields[field], response_mask)
    if "token_entropy" in plan.signals:
        found["token_entropy"] = fields["entropy"]
    kept = [n for n in ("advantages", "rm_scores") if n in fields]
    padded = TensorDict(
        {
            "response_mask": response_mask,
            "responses": fields["responses"],
            **{n: fields[n] for n in kept},
            **found,
        },
        batch_size=fields.batch_size,
    ).to_padded_tensor()
    context = None
    if critic or plan.reads_groups:
        context = reward_groups(padded["rm_scores"], fields["uid"])
    signals = CreditSignals(**{name: padded[name].float() for name in found})
    return PaddedInputs(padded, padded["response_mask"].bool(), signals, context)


def credit_fields(
    plan: CreditPlan, fields: TensorDict
) -> tuple[torch.Tensor, CreditDiagnostics | None]:
    """Nested token advantages (B, j) of ``plan``'s strategy from the TransferQueue
    ``fields`` (``fields_read(plan, critic=False)``) of a batch after verl's GRPO
    ``_compute_advantage``."""
    inputs = padded_inputs(plan, fields)
    padded = inputs.fields
    adv, diagnostics = token_advantages(
        plan.strategy,
        padded["advantages"],
        inputs.mask,
        padded["responses"],
        inputs.signals,
        inputs.context,
    )
    return response_to_nested(adv, fields["response_mask"]), diagnostics


def grpo_advantages(scores: torch.Tensor, mask: torch.Tensor, uid: object) -> torch.Tensor:
    """verl's own GRPO advantages (B, T) (``compute_grpo_outcome_advantage``, normalized by
    the group's std) of the padded token-level ``scores`` within the groups of ``uid``."""
    index: Any = np.array([str(u) for u in uid.tolist()], dtype=object)  # type: ignore[attr-defined]
    advantages, _ = compute_grpo_outcome_advantage(
        token_level_rewards=scores, response_mask=mask.float(), index=index
    )
    out: torch.Tensor = advantages
    return out


def critic_shift_fields(
    plan: CreditPlan, fields: TensorDict
) -> tuple[torch.Tensor, CreditDiagnostics | None]:
    """D (B, j), nested like ``response_mask``: ``critic_reward_shift`` of ``plan``'s
    strategy run on GRPO's advantages of verl's scores (``rm_scores``) within the prompts'
    groups (``uid``), from the TransferQueue ``fields`` (``fields_read(plan, critic=True)``)
    of a batch before verl's ``_compute_advantage``; 0 at rows without a valid token. The
    strategy's diagnostics."""
    inputs = padded_inputs(plan, fields, critic=True)
    padded, mask = inputs.fields, inputs.mask
    assert inputs.context is not None  # padded_inputs reads them under a critic
    advantages = grpo_advantages(padded["rm_scores"], mask, fields["uid"])
    result, rows = token_credit(
        plan.strategy, advantages, mask, padded["responses"], inputs.signals, inputs.context
    )
    shift = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    if result is None:
        return response_to_nested(shift, fields["response_mask"]), None
    form = plan.strategy.critic_reward_form
    if form is None:  # credit_settings refuses such a strategy under a critic estimator
        raise CreditError(f"algorithm.credit: {plan.name!r} has no critic_reward_form")
    context = inputs.context.select(rows)
    shift[rows] = critic_reward_shift(
        result,
        response_advantages(advantages, mask)[rows],
        context.rewards,
        context.groups,
        mask[rows],
        form,
        name=f"algorithm.credit: {plan.name}",
    )
    return response_to_nested(shift, fields["response_mask"]), result.diagnostics
