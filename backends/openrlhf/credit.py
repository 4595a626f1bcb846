"""OpenRLHF's credit on the one seam ``backends.common.credit.CreditRun``: the step's token
credit, its shift of the token rewards under a critic, and the direction model's agreement
with the reward.

``OpenRLHFCredit`` is the credit of the process that makes OpenRLHF's experience (its trainer
actor, where ``injection.install_in_trainer`` puts the token-credit experience maker): the
maker builds it from the ``ResolvedCredit`` whose plan ``compat.resolve_credit`` built in that
process, so the process holds one strategy instance. The driver's ``resolve_credit`` (run when
OpenRLHF's arguments are parsed, before ``ray.init``) is another process: Ray creates the
trainer actor in a worker, which resolves the settings against its own final arguments.

The last mile of every path is ``_credit``: each part of the step goes to ``CreditRun.apply``
(this backend's one call of it, hence of ``credit_core.assign_credit``), which runs the
strategy on the rows with an action token and leaves 0 elsewhere. A part is the whole step as
one batch (``step_batch``: action columns left-aligned, zero-padded) for a strategy that
selects tokens across the step (``gathers``) or reads its rewards and groups
(``reads_groups``), with R_i and each prompt's ``--rollout.n_samples_per_prompt`` samples a
group (``Experience.index`` // n), or reads the reward function's token rewards
(``reads_token_rewards``: ``process``; ``given_rewards.step_token_rewards`` of the
``extra_logs`` they rode in, aligned to the step's action masks); it is one micro-batch
otherwise, the signals taken one micro-batch at a time, so that the step's (B, A, d)
signals of the DATC family are never in one process at once (``compat.resolve_credit``
refuses a whole-step strategy reading them).

- ``grpo_credit``: under a response-level estimator, each response's advantage A_i (read from
  OpenRLHF's token advantages, ``response_advantages``) split over its action tokens and
  written into ``experience.advantages`` (0 off the action tokens; ``returns`` untouched).
- ``critic_credit``: under a critic (``gae``), the strategy run exactly as under GRPO, on
  GRPO's ``group_norm`` advantages of the same rollouts (``grpo_advantages``, OpenRLHF's own
  formula), turned into the shift D of OpenRLHF's token rewards
  (``credit_core.token_rewards.critic_reward_shift``; docs/design.md, "Credit under a
  critic"), which the maker adds where they enter OpenRLHF's GAE.

Both give the step's ``AgreementMetrics`` (``CreditRun.measure``, once per step) for a
strategy that reads a direction model (docs/design.md, "Trusting the direction model"): the
within-group rank agreement of the direction model's own scores (``ActorSignals
.direction_reward``, from the pass that gave its signals: no extra pass) with the reward the
advantages were formed from, over the step's whole groups. OpenRLHF cuts its micro-batches
from the rollout without regard to prompts (``--train.dynamic_batch_enable`` regroups them by
tokens), so a group may straddle micro-batches: the parts are credited with
``apply(measured=True)`` and the step measured once, when it is whole. Where the direction
model is OpenRLHF's reward model (``ResolvedCredit.direction_is_reward``) the agreement is 1 by
construction and only ``credit/direction_is_reward`` is reported. A path strategy
(``datc_mid``, ``datc_ig``), whose passes are on the path to m1, gets its direction model's
score of the samples from one no-grad forward more (``ActorCreditState.score_samples``).

``credit.gate`` stays refused by this backend (``settings.build_config``): the agreement of a
step is known only after its last micro-batch's signals (which carry the scores) were taken,
by when every micro-batch was credited, while ``CreditRun.apply`` mixes at the alpha current
when it runs; a gate here would mix each step at the previous step's EMA, unlike the native
trainer, and OpenRLHF's checkpoint has no place for the EMA (a resume would restart it).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from backends.common.credit import AgreementMetrics, CreditRun
from backends.openrlhf.actor_side import ActorSignals
from backends.openrlhf.compat import ResolvedCredit
from backends.openrlhf.given_rewards import step_token_rewards
from backends.openrlhf.layout import action_token_ids
from backends.openrlhf.step_batch import (
    StepBatch,
    outcome_rewards,
    padded,
    stacked_signals,
    step_batch,
    step_groups,
)
from credit_core import (
    CreditDiagnostics,
    CreditError,
    CreditResult,
    CreditSignals,
    TokenRewards,
)
from credit_core.advantages import group_advantages
from credit_core.allocation import UNIFORM_DIAGNOSTICS
from credit_core.strategy import CreditStrategy
from credit_core.token_rewards import critic_reward_shift

#: Relative tolerance of the check that a response's action tokens share one advantage.
CONSTANT_ADVANTAGE_RTOL = 1e-6
#: OpenRLHF's ``group_norm``: (r - mean) / (std + 1e-9).
GROUP_NORM_EPS = 1e-9


def response_advantages(advantages: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    """(B,) the advantage of each response: its value on the action tokens (0 if it has none).

    Raises ``CreditError`` naming the responses whose action tokens carry different values
    (a per-token KL penalty in the reward, ``gae``, ``reinforce`` with gamma < 1).
    """
    acts = action_mask.bool()
    first = acts.long().argmax(dim=1, keepdim=True)
    value = advantages.gather(1, first)
    deviation = torch.where(acts, (advantages - value).abs(), 0.0).amax(dim=1)
    bad = deviation > CONSTANT_ADVANTAGE_RTOL * (1.0 + value.squeeze(1).abs())
    if bool(bad.any()):
        rows = torch.nonzero(bad).flatten().tolist()
        raise CreditError(
            "experience.advantages: token credit splits one advantage per response, but "
            f"responses {rows} have different advantages on their action tokens (max deviation "
            f"{float(deviation.max()):.3g}); a KL penalty inside the reward, 'gae' or gamma < 1 "
            "cause this"
        )
    return torch.where(acts.any(dim=1), value.squeeze(1), 0.0)


def grpo_advantages(rewards: torch.Tensor, groups: torch.Tensor, n: int) -> torch.Tensor:
    """(N,) float32: GRPO's ``group_norm`` advantage of each response (OpenRLHF's formula)."""
    order = torch.argsort(groups, stable=True)
    out = torch.empty_like(rewards)
    out[order] = group_advantages(rewards[order], n, "group_norm", eps=GROUP_NORM_EPS)
    return out


@dataclass(frozen=True)
class StepCredit:
    """What the credit of one step gives the maker to log (and, under a critic, to add).

    - ``diagnostics``: the strategy's weight diagnostics of each micro-batch (the step's,
      repeated, for a whole-step strategy; ``UNIFORM_DIAGNOSTICS`` for a micro-batch without
      an action token).
    - ``agreement``: the step's ``AgreementMetrics``, None where nothing is measured (module
      docstring).
    - ``shifts``: under a critic, one (B_k, A_k) float32 shift of each micro-batch's token
      rewards, 0 off the action tokens (each response's sum 0 for a ``weights`` strategy);
      None under a response-level estimator.
    """

    diagnostics: list[CreditDiagnostics]
    agreement: AgreementMetrics | None
    shifts: list[torch.Tensor] | None = None


@dataclass(frozen=True)
class _Part:
    """One ``CreditRun.apply`` call's batch: advantages (n,), mask and token ids (n, A),
    signals, and the rewards and groups (n,) where the part is the whole step."""

    advantages: torch.Tensor
    mask: torch.Tensor
    token_ids: torch.Tensor
    signals: CreditSignals
    rewards: torch.Tensor | None = None
    groups: torch.Tensor | None = None


class OpenRLHFCredit:
    """The credit of the experience-making process (module docstring): its one ``CreditRun``
    (``run``), built on the plan of ``resolved`` (no second strategy instance)."""

    def __init__(self, resolved: ResolvedCredit) -> None:
        self.resolved = resolved
        self.run = CreditRun(resolved.plan, direction_is_reward=resolved.direction_is_reward)

    @property
    def strategy(self) -> CreditStrategy:
        """The process's one strategy instance."""
        return self.run.strategy

    @property
    def whole_step(self) -> bool:
        """Whether the strategy sees the step as one batch (``gathers``, ``reads_groups``
        or ``reads_token_rewards``)."""
        s = self.strategy
        return s.gathers or s.reads_groups or s.reads_token_rewards

    @property
    def reads_rewards(self) -> bool:
        """Whether a step under a response-level estimator needs the response rewards and
        groups: the strategy reads them, or the agreement is measured against them."""
        run = self.run
        return self.strategy.reads_groups or (run.measures and not run.direction_is_reward)

    def grpo_credit(
        self,
        experiences: Sequence[Any],
        signals: Iterable[ActorSignals],
        *,
        n_samples_per_prompt: int,
    ) -> StepCredit:
        """Replace every micro-batch's ``advantages`` (B_k, A_k) by the strategy's token
        advantages, cast to their dtype (0 off the action tokens; ``returns`` untouched),
        with the step's diagnostics and agreement.

        ``experiences``: the step's micro-batches after OpenRLHF's advantages (one value per
        response on its action tokens, ``response_advantages``); ``signals`` one per
        micro-batch, in order (taken one at a time). Where ``reads_rewards``, R_i is the
        reward OpenRLHF's estimator normalized (``experience.rewards`` after its length
        penalties; it clamps the normalized value to ``--reward.clip_range``, not R_i), and
        each prompt's ``n_samples_per_prompt`` samples a group.
        """
        rewards = groups = None
        if self.reads_rewards:
            rewards = outcome_rewards(experiences, None)
            groups = step_groups(experiences, n_samples_per_prompt)
        advantages = torch.cat(
            [response_advantages(e.advantages, e.action_mask.bool()) for e in experiences]
        )
        step = step_batch(experiences)
        result, diagnostics, agreement = self._credit(
            experiences, step, signals, advantages, rewards, groups
        )
        for experience, out in zip(experiences, step.split(result.token_advantages), strict=True):
            target = experience.advantages
            experience.advantages = out.to(device=target.device, dtype=target.dtype).contiguous()
        return StepCredit(diagnostics, agreement)

    def critic_credit(
        self,
        experiences: Sequence[Any],
        signals: Iterable[ActorSignals],
        *,
        n_samples_per_prompt: int,
        clip_range: Sequence[float] | None,
    ) -> StepCredit:
        """The shift D of each micro-batch's token rewards (module docstring), with the
        step's diagnostics and agreement.

        ``experiences``: the step's micro-batches, after OpenRLHF's length penalties, with
        ``action_mask`` (B_k, A_k), ``sequences``, ``rewards`` (B_k,) and ``index``; the
        rewards clamped to ``clip_range`` as OpenRLHF's ``compute_reward`` clamps them.
        ``CreditError`` when a group has fewer than 2 responses or the strategy has no
        ``critic_reward_form``.
        """
        strategy = self.strategy
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
        result, diagnostics, agreement = self._credit(
            experiences, step, signals, advantages, rewards, groups
        )
        shift = critic_reward_shift(
            result, advantages, rewards, groups, step.mask, form, name=strategy.name
        )
        return StepCredit(diagnostics, agreement, step.split(shift))

    def _credit(
        self,
        experiences: Sequence[Any],
        step: StepBatch,
        signals: Iterable[ActorSignals],
        advantages: torch.Tensor,
        rewards: torch.Tensor | None,
        groups: torch.Tensor | None,
    ) -> tuple[CreditResult, list[CreditDiagnostics], AgreementMetrics | None]:
        """The step's credit (N, W) (token advantages float32, the token rewards float64 of
        a strategy that gives them), each micro-batch's diagnostics and the step's agreement:
        every part through ``CreditRun.apply``, then ``CreditRun.measure`` once."""
        scores: list[torch.Tensor | None] = []
        results: list[CreditResult] = []
        diagnostics: list[CreditDiagnostics] = []
        given = None
        if self.strategy.reads_token_rewards:
            given = step_token_rewards(experiences, step.mask)
        parts = self._parts(experiences, step, signals, advantages, rewards, groups, given, scores)
        for part in parts:
            result = self.run.apply(
                part.advantages,
                part.mask,
                part.token_ids,
                part.signals,
                rewards=part.rewards,
                groups=part.groups,
                measured=True,
            ).result
            results.append(result)
            logged = result.diagnostics if bool(part.mask.any()) else UNIFORM_DIAGNOSTICS
            diagnostics.append(logged)
        if self.whole_step:
            diagnostics = diagnostics * len(experiences)
        agreement = self._agreement(scores, rewards, groups)
        return _stacked(results, step.width), diagnostics, agreement

    def _parts(
        self,
        experiences: Sequence[Any],
        step: StepBatch,
        signals: Iterable[ActorSignals],
        advantages: torch.Tensor,
        rewards: torch.Tensor | None,
        groups: torch.Tensor | None,
        given: TokenRewards | None,
        scores: list[torch.Tensor | None],
    ) -> Iterator[_Part]:
        """The step as one part (a whole-step strategy: the micro-batches' per-token signals
        stacked, ``stacked_signals``) or one part per micro-batch, each micro-batch's
        signals taken when its part is credited; the reward function's token rewards
        ``given`` (N, W) go with the step (a strategy that reads them sees the whole step).
        Appends each micro-batch's direction scores to ``scores`` as its signals are taken."""
        if self.whole_step:
            taken = list(signals)
            scores += [signal.direction_reward for signal in taken]
            credits = stacked_signals([signal.credit() for signal in taken], step.width)
            credits = replace(credits, token_rewards=given)
            yield _Part(advantages, step.mask, step.token_ids, credits, rewards, groups)
            return
        parts = zip(experiences, torch.split(advantages, step.sizes), signals, strict=True)
        for experience, part_advantages, signal in parts:
            scores.append(signal.direction_reward)
            yield _Part(
                part_advantages,
                experience.action_mask.bool(),
                action_token_ids(experience.sequences, experience.action_mask),
                signal.credit(),
            )

    def _agreement(
        self,
        scores: list[torch.Tensor | None],
        rewards: torch.Tensor | None,
        groups: torch.Tensor | None,
    ) -> AgreementMetrics | None:
        """The step's ``CreditRun.measure`` from the micro-batches' direction ``scores``
        (B_k,) with ``rewards`` and ``groups`` (N,); None for a strategy that reads no
        direction model. ``CreditError`` naming the micro-batches whose signals carry no
        score."""
        run = self.run
        if not run.measures or run.direction_is_reward:
            return run.measure(None, None, None)
        lacking = [k for k, score in enumerate(scores) if score is None]
        if lacking:
            raise CreditError(
                f"credit agreement: strategy {run.plan.name!r} reads a direction model, but "
                f"the signals of micro-batches {lacking} carry no direction_reward"
            )
        present = [score for score in scores if score is not None]
        return run.measure(torch.cat(present).float(), rewards, groups)


def _stacked(results: Sequence[CreditResult], width: int) -> CreditResult:
    """The parts' results (n_k, A_k) stacked in order into one (N, ``width``) result, zero
    columns appended; its diagnostics are the first part's (the critic's shift reads the
    token advantages and rewards only)."""
    token_advantages = torch.cat(
        [padded(r.token_advantages.to(torch.float32), width) for r in results]
    )
    token_rewards = None
    if any(r.token_rewards is not None for r in results):
        token_rewards = torch.cat(
            [
                padded(
                    torch.zeros(r.token_advantages.shape, dtype=torch.float64)
                    if r.token_rewards is None
                    else r.token_rewards.to(torch.float64),
                    width,
                )
                for r in results
            ]
        )
    return CreditResult(token_advantages, results[0].diagnostics, token_rewards)
