"""``CreditRun``: a process's credit, built once, applied at every step's last mile.

One ``CreditRun`` per process holds the run's ``CreditPlan`` (its strategy, built once, and
the signals it computes) and, where the credit setting has a ``gate``, the ``AgreementGate``.
``apply`` is the step's credit: ``assign_credit``, then, for a strategy that reads a direction
model, the direction model's within-group agreement with the reward on the step's responses
(from the scores its pass gave anyway: no extra forward) and, with a gate, the mix of the
token advantages toward GRPO by the gate's alpha (docs/design.md, "Trusting the direction
model"). Where the backend computes the reward gradient's attribution (P2T's
``reward_attribution``, or a gate ``measure: attribution``, whose plan asks for it), the step also
reports the agreement of each response's summed attribution with the reward. The gate's EMA is
the run's only credit state beside the strategy's own (``state_dict`` / ``load_state_dict``).
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
    GateMeasure,
    direction_agreement,
    gate_token_advantages,
)
from credit_core.batch import Gather
from credit_core.plan import Backend, CreditPlan
from credit_core.strategy import CreditStrategy
from credit_core.tensor_checks import check_finite_at, check_tensor

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
    - ``attribution``: the same agreement of each response's summed reward attribution,
      sum_t (e_t - e_null) . g_t, where the step computed it; None where it did not.
    - ``gate_measure``: what the gate's EMA is of (``GateConfig.measure``).
    """

    direction_is_reward: bool
    value: float = math.nan
    groups: int = 0
    skipped: int = 0
    ema: float | None = None
    alpha: float | None = None
    attribution: float | None = None
    gate_measure: GateMeasure = "score"

    def to_dict(self, prefix: str = "credit/") -> dict[str, float]:
        """The step's metrics: ``direction_is_reward`` (1 or 0), where it is 0 the
        agreement, its groups and skipped groups; the attribution agreement where measured;
        with a gate its EMA (``direction_agreement_ema`` or ``attribution_agreement_ema``,
        after ``gate_measure``; NaN before any measure) and alpha."""
        out = {f"{prefix}direction_is_reward": float(self.direction_is_reward)}
        if not self.direction_is_reward:
            out[f"{prefix}direction_agreement"] = self.value
            out[f"{prefix}agreement_groups"] = float(self.groups)
            out[f"{prefix}agreement_skipped"] = float(self.skipped)
        if self.attribution is not None:
            out[f"{prefix}attribution_agreement"] = self.attribution
        if self.alpha is not None:
            of = "direction" if self.gate_measure == "score" else "attribution"
            out[f"{prefix}{of}_agreement_ema"] = math.nan if self.ema is None else self.ema
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
    both); a gate ``measure: score`` is then refused, as there is nothing to measure it by (its
    score agrees by construction; its gradient's attribution does not, so ``measure:
    attribution`` is served). A gate on a strategy that is no mean-preserving weight form is
    refused too (``CreditConfig`` refuses it first for a config; this guards a plan built
    from an instance). ``measures_apart``: the backend measures the step with ``measure``
    before the signals exist (``apply(measured=True)``); a gate ``measure: attribution``, which
    needs the step's attributions, is then refused.
    """

    def __init__(
        self,
        plan: CreditPlan,
        gate: GateConfig | None = None,
        *,
        direction_is_reward: bool = False,
        measures_apart: bool = False,
    ) -> None:
        self.plan = plan
        self.direction_is_reward = direction_is_reward
        self.gate: AgreementGate | None = None
        self.gate_measure: GateMeasure = "score" if gate is None else gate.measure
        if gate is None:
            return
        if gate.measure == "attribution" and "reward_attribution" not in plan.signals:
            raise CreditError(
                "credit.gate.measure: 'attribution' reads reward_attribution, which the plan does "
                "not compute (build the plan from the credit config that holds the gate)"
            )
        if gate.measure == "attribution" and measures_apart:
            raise CreditError(
                "credit.gate.measure: 'attribution' ranks the step's summed attributions, which "
                "this backend does not have where it measures the step (before its "
                "micro-batches' signals); use measure: score here, or the native trainer or verl"
            )
        if not self.measures:
            raise CreditError(f"credit.gate: strategy {plan.name!r} reads no direction model")
        if plan.strategy.critic_reward_form != "weights":
            raise CreditError(
                f"credit.gate: strategy {plan.name!r} gives no mean-preserving weights; the "
                "gate's mix is defined on them"
            )
        if direction_is_reward and gate.measure == "score":
            raise CreditError(
                f"credit.gate: the reward is the direction model's own score, so its agreement "
                f"with the reward is 1 by construction and the gate would never act; give "
                f"{plan.name!r} a separate reward (a scorer), gate measure: attribution, or drop "
                "the gate"
            )
        self.gate = gate.build()

    @classmethod
    def build(
        cls,
        credit: CreditConfig,
        backend: Backend,
        *,
        direction_is_reward: bool = False,
        measures_apart: bool = False,
    ) -> CreditRun:
        """The run of a parsed credit setting on ``backend`` (``CreditPlan.build``)."""
        return cls(
            CreditPlan.build(credit, backend),
            credit.gate,
            direction_is_reward=direction_is_reward,
            measures_apart=measures_apart,
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

        ``signals.reward_attribution`` (B, T), where given, also gives the attribution
        agreement (``summed_attribution``); the signals only the gate reads
        (``plan.gate_signals``) are taken out before ``assign_credit``.
        """
        attributions = None
        if signals is not None and signals.reward_attribution is not None and not measured:
            attributions = summed_attribution(signals.reward_attribution, mask)
        if signals is not None and self.plan.gate_signals:
            signals = replace(signals, **dict.fromkeys(self.plan.gate_signals))
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
                direction_scores,
                rewards,
                groups,
                attributions=attributions,
                reduce_sum=reduce_sum,
                advance=advance,
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
        attributions: torch.Tensor | None = None,
        reduce_sum: ReduceSum | None = None,
        advance: bool = True,
    ) -> AgreementMetrics | None:
        """The step's ``AgreementMetrics`` (None for a strategy that reads no direction
        model): ``direction_agreement`` of ``direction_scores`` (B,) with ``rewards`` (B,) in
        ``groups`` (B,) int64 (not where the run's reward is the direction model's own:
        ``direction_is_reward``), the same of ``attributions`` (B,) where given, each summed
        over processes by ``reduce_sum`` (as in ``apply``), and, with a gate, the EMA of the
        one it measures folded in (unless ``advance`` is False) and its alpha.
        ``CreditError`` when an input the step needs is missing. Call it once per training
        step: each call with ``advance`` moves the gate's EMA."""
        if not self.measures:
            return None
        partial = attributions is None or rewards is None or groups is None
        if self.direction_is_reward and self.gate is None and partial:
            return AgreementMetrics(direction_is_reward=True)
        needs_scores = not self.direction_is_reward
        if rewards is None or groups is None or (needs_scores and direction_scores is None):
            raise CreditError(
                f"CreditRun.apply: strategy {self.plan.name!r} reads a direction model; its "
                "agreement needs "
                + ("direction_scores, " if needs_scores else "")
                + "rewards and groups"
            )
        if self.gate_measure == "attribution" and attributions is None:
            raise CreditError(
                "CreditRun.apply: the gate is on the attribution agreement; it needs "
                "signals.reward_attribution"
            )
        score = attribution = None
        if direction_scores is not None and needs_scores:
            score = _step_agreement(
                direction_agreement(direction_scores, rewards, groups), reduce_sum
            )
        if attributions is not None:
            attribution = _step_agreement(
                direction_agreement(attributions, rewards, groups), reduce_sum
            )
        ema = alpha = None
        if self.gate is not None:
            keyed = attribution if self.gate_measure == "attribution" else score
            assert keyed is not None  # checked above
            alpha = self.gate.update(keyed) if advance else self.gate.alpha
            ema = self.gate.ema
        return AgreementMetrics(
            self.direction_is_reward,
            score.value if score is not None else math.nan,
            score.groups if score is not None else 0,
            score.skipped if score is not None else 0,
            ema,
            alpha,
            attribution.value if attribution is not None else None,
            self.gate_measure,
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


def summed_attribution(attribution: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each response's summed reward attribution (B,) float64: sum over its valid tokens
    (``mask`` (B, T) bool) of ``attribution`` (B, T), the first-order account
    sum_t (e_t - e_null) . g_t of its reward (docs/design.md, "Trusting the direction
    model"). ``CreditError`` naming ``reward_attribution`` where a valid token's value is
    not finite."""
    a = check_tensor("reward_attribution", attribution, (None, None), floating=True).detach()
    m = check_tensor("mask", mask, tuple(a.shape), dtype=torch.bool, device=a.device)
    check_finite_at("reward_attribution", a, m)
    return torch.where(m, a.double(), 0.0).sum(dim=1)


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
