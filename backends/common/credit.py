"""``CreditRun``: a process's credit, built once, applied at every step's last mile.

One ``CreditRun`` per process holds the run's ``CreditPlan`` (its strategy, built once, and
the signals it computes) and, where the credit setting has a ``gate``, the ``AgreementGate``.
``apply`` is the step's credit: ``assign_credit``, then, for a strategy that reads a direction
model, the direction model's within-group agreement with the reward on the step's responses
(from the scores its pass gave anyway: no extra forward) and, with a gate, the mix of the
token advantages toward GRPO by the gate's alpha (docs/design.md, "Trusting the direction
model"). The gate's EMA is the run's only credit state beside the strategy's own
(``state_dict`` / ``load_state_dict``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from credit_core import CreditConfig, CreditError, CreditResult, CreditSignals, assign_credit
from credit_core.agreement_gate import (
    Agreement,
    AgreementGate,
    GateConfig,
    direction_agreement,
    gate_token_advantages,
)
from credit_core.batch import Gather
from credit_core.plan import Backend, CreditPlan
from credit_core.strategy import CreditStrategy

#: Sums a float64 tensor over the step's processes (every process gets the sum).
ReduceSum = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class AgreementMetrics:
    """One step's measure of the direction model against the reward, over the whole step.

    - ``direction_is_reward``: the reward came from the direction model's own scores (its
      agreement is 1 by construction: nothing else is reported).
    - ``value``: mean over the used groups of Spearman's rho of the direction model's scores
      with the rewards (``direction_agreement``); NaN when no group was used.
    - ``groups`` / ``skipped``: groups with varying / constant reward.
    - ``ema`` (None before any used group) and ``alpha``: the gate's, after this step's
      update; both None without a gate.
    """

    direction_is_reward: bool
    value: float = math.nan
    groups: int = 0
    skipped: int = 0
    ema: float | None = None
    alpha: float | None = None

    def to_dict(self, prefix: str = "credit/") -> dict[str, float]:
        """The step's metrics: ``direction_is_reward`` (1 or 0), and where it is 0 the
        agreement, its groups and skipped groups, and with a gate its EMA (NaN before any
        measure) and alpha."""
        if self.direction_is_reward:
            return {f"{prefix}direction_is_reward": 1.0}
        out = {
            f"{prefix}direction_is_reward": 0.0,
            f"{prefix}direction_agreement": self.value,
            f"{prefix}agreement_groups": float(self.groups),
            f"{prefix}agreement_skipped": float(self.skipped),
        }
        if self.alpha is not None:
            out[f"{prefix}direction_agreement_ema"] = math.nan if self.ema is None else self.ema
            out[f"{prefix}gate_alpha"] = self.alpha
        return out


@dataclass(frozen=True)
class CreditStep:
    """What ``CreditRun.apply`` returns: the strategy's ``CreditResult`` (its token
    advantages mixed by the gate where there is one; its diagnostics are the strategy's own
    weights') and the step's ``AgreementMetrics`` (None for a strategy that reads no
    direction model)."""

    result: CreditResult
    agreement: AgreementMetrics | None


class CreditRun:
    """The credit of one process: ``plan`` (strategy and signals), the optional ``gate``.

    ``direction_is_reward``: the run's reward is the direction model's own (one model for
    both); a gate is then refused, as there is nothing to measure it by. A gate on a strategy
    that is no mean-preserving weight form is refused too (``CreditConfig`` refuses it first
    for a config; this guards a plan built from an instance).
    """

    def __init__(
        self,
        plan: CreditPlan,
        gate: GateConfig | None = None,
        *,
        direction_is_reward: bool = False,
    ) -> None:
        self.plan = plan
        self.direction_is_reward = direction_is_reward
        self.gate: AgreementGate | None = None
        if gate is None:
            return
        if not self.measures:
            raise CreditError(f"credit.gate: strategy {plan.name!r} reads no direction model")
        if plan.strategy.critic_reward_form != "weights":
            raise CreditError(
                f"credit.gate: strategy {plan.name!r} gives no mean-preserving weights; the "
                "gate's mix is defined on them"
            )
        if direction_is_reward:
            raise CreditError(
                f"credit.gate: the reward is the direction model's own score, so its agreement "
                f"with the reward is 1 by construction and the gate would never act; give "
                f"{plan.name!r} a separate reward (a scorer) or drop the gate"
            )
        self.gate = gate.build()

    @classmethod
    def build(
        cls, credit: CreditConfig, backend: Backend, *, direction_is_reward: bool = False
    ) -> CreditRun:
        """The run of a parsed credit setting on ``backend`` (``CreditPlan.build``)."""
        return cls(
            CreditPlan.build(credit, backend), credit.gate, direction_is_reward=direction_is_reward
        )

    @property
    def strategy(self) -> CreditStrategy:
        """The run's one strategy instance."""
        return self.plan.strategy

    @property
    def measures(self) -> bool:
        """Whether the strategy reads a direction model's pass over the step's responses (a
        signal from the ``direction`` source, or DATC's W0 formed from its gradient): each
        step then reports the model's agreement with the reward."""
        return self.plan.needs_reward_grad or bool(self.plan.from_source("direction"))

    def apply(
        self,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        token_ids: torch.Tensor,
        signals: CreditSignals | None = None,
        *,
        rewards: torch.Tensor | None = None,
        groups: torch.Tensor | None = None,
        direction_scores: torch.Tensor | None = None,
        gather: Gather | None = None,
        reduce_sum: ReduceSum | None = None,
        answer_mask: torch.Tensor | None = None,
        advance: bool = True,
        measured: bool = False,
    ) -> CreditStep:
        """The step's credit: ``assign_credit`` (arguments as there), then, for a strategy
        that reads a direction model, its agreement on this step (``measure``) and the gate's
        mix.

        ``direction_scores`` (B,): the direction model's score of each response, where the
        reward came from a separate scorer; with ``rewards`` (B,) and ``groups`` (B,) int64
        it gives the agreement (``direction_agreement``; groups must not straddle
        processes). ``reduce_sum``: the sum over the step's processes, for a step that spans
        several (every process then gets the step's agreement and the same alpha). With a
        gate the mix is ``gate_token_advantages`` at the alpha after this step's update;
        ``advance=False`` (a look at a batch that is not a training step's) leaves the EMA
        as it is and mixes at its current alpha. ``measured=True``: the backend took this
        step's agreement with ``measure`` itself (where it still knows the step's groups,
        e.g. before its rows were shuffled into micro-batches); ``apply`` then measures
        nothing, mixes at the gate's current alpha and returns no ``AgreementMetrics``.
        """
        result = assign_credit(
            self.strategy,
            advantages,
            mask,
            token_ids,
            signals,
            rewards=rewards,
            groups=groups,
            gather=gather,
            answer_mask=answer_mask,
        )
        agreement = None
        if not measured:
            agreement = self.measure(
                direction_scores, rewards, groups, reduce_sum=reduce_sum, advance=advance
            )
        if self.gate is None:
            return CreditStep(result, agreement)
        mixed = gate_token_advantages(result.token_advantages, advantages, mask, self.gate.alpha)
        return CreditStep(replace(result, token_advantages=mixed), agreement)

    def measure(
        self,
        direction_scores: torch.Tensor | None,
        rewards: torch.Tensor | None,
        groups: torch.Tensor | None,
        *,
        reduce_sum: ReduceSum | None = None,
        advance: bool = True,
    ) -> AgreementMetrics | None:
        """The step's ``AgreementMetrics`` (None for a strategy that reads no direction
        model; ``direction_is_reward`` where the run's reward is the direction model's):
        ``direction_agreement`` of ``direction_scores`` (B,) with ``rewards`` (B,) in
        ``groups`` (B,) int64, summed over processes by ``reduce_sum`` (as in ``apply``),
        and, with a gate, its EMA folded in (unless ``advance`` is False) and its alpha.
        ``CreditError`` when one of the three is missing. Call it once per training step:
        each call with ``advance`` moves the gate's EMA."""
        if not self.measures:
            return None
        if self.direction_is_reward:
            return AgreementMetrics(direction_is_reward=True)
        if direction_scores is None or rewards is None or groups is None:
            raise CreditError(
                f"CreditRun.apply: strategy {self.plan.name!r} reads a direction model; its "
                "agreement needs direction_scores, rewards and groups"
            )
        agreement = _step_agreement(
            direction_agreement(direction_scores, rewards, groups), reduce_sum
        )
        if self.gate is None:
            return AgreementMetrics(False, agreement.value, agreement.groups, agreement.skipped)
        alpha = self.gate.update(agreement) if advance else self.gate.alpha
        return AgreementMetrics(
            False, agreement.value, agreement.groups, agreement.skipped, self.gate.ema, alpha
        )

    def state_dict(self) -> dict[str, Any]:
        """The gate's state (its EMA); empty without a gate."""
        return {} if self.gate is None else {"gate": self.gate.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict()``; ``CreditError`` if it does not match the run's gate."""
        if (self.gate is None) != ("gate" not in state):
            raise CreditError(
                f"credit state: the run {'has no' if self.gate is None else 'has a'} gate, "
                f"the saved state has keys {sorted(state)}"
            )
        if self.gate is not None:
            self.gate.load_state_dict(state["gate"])


def _step_agreement(local: Agreement, reduce_sum: ReduceSum | None) -> Agreement:
    """The step's agreement from this process's (groups never straddle processes): the
    group-weighted mean of the processes' means."""
    if reduce_sum is None:
        return local
    rho_sum = local.value * local.groups if local.groups else 0.0
    total = reduce_sum(
        torch.tensor([rho_sum, float(local.groups), float(local.skipped)], dtype=torch.float64)
    )
    rho, used, skipped = (float(x) for x in total)
    return Agreement(rho / used if used else math.nan, int(used), int(skipped))
