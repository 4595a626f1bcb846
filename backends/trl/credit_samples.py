"""Credit samples in the TRL backend (``credit_samples_*`` fields of ``CreditGRPOConfig``).

At a recorded optimizer step (every ``credit_samples_steps`` steps, by default at TRL's
``logging_steps``, and the last) at which ``CreditGRPOTrainer.token_advantages`` forms token
advantages (every step in the loss phase; in the generation phase, the steps at which TRL
generates: a generation serves ``steps_per_generation x num_iterations`` steps), the first
time it does so for that step (on every process at once), ``TrlSampleRecorder.record``
takes ``credit_samples_count`` responses of that batch (``backends.samples.records.pick_rows``:
in the generation phase the rows are TRL's contiguous groups of ``num_generations``; in the
loss phase TRL has shuffled them, so the micro-batch is taken as one group: its highest and
lowest A) with their prompt, tokens,
reward (the weighted sum of TRL's reward functions, as TRL's advantage uses it), A and
token advantages. Each compared strategy's token advantages come from ``CreditRun.apply`` on
the same batch (all its valid rows, every process for a batch-wide selection such as
``random_top``) with the same signals (``compared_signals``): a compared strategy must
read no signal the run does not compute and take the reward gradient where the run takes
it (refused at start-up otherwise). A recorded step whose picked rows hold no valid token
is skipped. The main process appends the record to ``<output_dir>/credit_samples.jsonl``
and, when TRL logs to TensorBoard, logs the heat-map as the image ``credit/samples``
through TRL's own TensorBoard writer (same event files as its scalars).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from backends.common.credit import AgreementMetrics
from backends.samples.records import (
    SamplesWriter,
    StepAgreement,
    StepSamples,
    pick_rows,
    response_samples,
)
from credit_core import CreditError, CreditSignals
from credit_core.plan import CreditPlan

IMAGE_TAG = "credit/samples"

#: Key of TRL's inputs dict that carries each row's reward (B,) (the weighted sum of TRL's
#: reward functions) to where the token advantages are formed.
REWARDS_KEY = "credit_rewards"


def compared_strategies(
    run: CreditPlan, run_label: str, compare: Sequence[tuple[str, CreditPlan]]
) -> list[tuple[str, CreditPlan]]:
    """(label, plan) of each compared credit (its label and its plan, built once from
    ``credit_samples_compare.<i>``) but the run's own (``run_label``, shown as the run's
    row); ``CreditError`` naming ``credit_samples_compare.<i>`` when it needs a signal the
    run's plan does not compute, takes the reward gradient elsewhere, or reads the step's
    groups or the token rewards and the run's strategy does not (TRL's credit gets them
    only for a run that reads them)."""
    have = run.signals
    out = []
    for i, (label, plan) in enumerate(compare):
        if label == run_label:  # the run's own row shows it
            continue
        needs = plan.signals
        key = f"credit_samples_compare.{i}"
        if not needs <= have:
            raise CreditError(
                f"{key}: {plan.name!r} reads {sorted(needs)}, but the run's strategy "
                f"{run.name!r} computes {sorted(have) or 'no signal'}; compare strategies "
                "that read what the run computes"
            )
        lacking = sorted((plan.features & {"groups", "token_rewards"}) - run.features)
        if lacking:
            raise CreditError(
                f"{key}: {plan.name!r} reads {lacking}, which the run's strategy {run.name!r} "
                "does not read, so the run's credit does not get them; compare strategies "
                "that read what the run reads"
            )
        if needs and plan.reward_grad_points != run.reward_grad_points:
            raise CreditError(
                f"{key}: {plan.name!r} takes the reward gradient at other points than "
                f"{run.name!r} (reward_grad_points {plan.reward_grad_points} vs "
                f"{run.reward_grad_points})"
            )
        out.append((label, plan))
    return out


def compared_signals(plan: CreditPlan, signals: CreditSignals) -> CreditSignals:
    """The part of the run's ``signals`` that the compared ``plan`` reads (the token
    rewards included, where it reads them)."""
    found = {name: getattr(signals, name) for name in plan.signals}
    if plan.reads_token_rewards:
        found["token_rewards"] = signals.token_rewards
    return CreditSignals(**found)


class TrlSampleRecorder:
    """Records the credit samples of the TRL steps that are due (see the module docstring)."""

    def __init__(
        self,
        *,
        interval: int,
        count: int,
        own: str,
        compare: Sequence[tuple[str, CreditPlan]],
        tokenizer: Any,
        output_dir: str,
        enabled: bool,
        tensorboard: Callable[[], Any],
    ) -> None:
        self.interval = interval
        self.count = count
        self.own = own
        self.compare = list(compare)
        self.tokenizer = tokenizer
        self.output_dir = output_dir
        self.enabled = enabled
        self.tensorboard = tensorboard
        self._writer: SamplesWriter | None = None
        self._last = -1

    @property
    def labels(self) -> list[str]:
        """The labels of the compared strategies."""
        return [label for label, _ in self.compare]

    def due(self, step: int, max_steps: int) -> bool:
        """Whether optimizer step ``step`` (>= 1) is recorded and not recorded yet."""
        every = self.interval > 0 and (step % self.interval == 0 or step == max_steps)
        return every and step != self._last

    def record(
        self,
        step: int,
        batch: dict[str, Any],
        credits: dict[str, torch.Tensor],
        mask: torch.Tensor,
        group_size: int,
        agreement: AgreementMetrics | None = None,
    ) -> None:
        """Record ``step`` from ``batch`` (TRL's, with ``advantages`` (B,), ``prompt_ids``/
        ``prompt_mask``, ``completion_ids`` and the rewards under ``REWARDS_KEY``), the
        token advantages (B, T) of the run (``own``) and of each compared strategy
        (``credits``, by label) and the loss ``mask``. The step counts as recorded even when
        the picked rows hold no valid token (then nothing is written)."""
        self._last = step
        A = batch["advantages"]
        rows = [r for r in pick_rows(A, group_size, self.count) if bool(mask[r].any())]
        if not rows:
            return
        index = torch.tensor(rows, device=A.device)
        ids = batch["completion_ids"][index].long()
        token_adv = {label: credits[label][index] for label in (self.own, *self.labels)}
        prompts = [
            str(self.tokenizer.decode(p[m.bool()].tolist(), skip_special_tokens=False))
            for p, m in zip(batch["prompt_ids"][index], batch["prompt_mask"][index], strict=True)
        ]
        tokens = [
            [str(self.tokenizer.decode([t])) for t in row[m].tolist()]
            for row, m in zip(ids, mask[index].bool(), strict=True)
        ]
        record = StepSamples(
            step=step,
            strategy=self.own,
            compare=self.labels,
            samples=response_samples(
                prompts=prompts,
                tokens=tokens,
                rewards=batch[REWARDS_KEY][index],
                advantages=A[index],
                token_advantages={k: v.float().cpu() for k, v in token_adv.items()},
                mask=mask[index].cpu(),
            ),
            agreement=None if agreement is None else StepAgreement.of(agreement),
        )
        if self._writer is None:  # records after the step a resumed run starts at are dropped
            self._writer = SamplesWriter(self.output_dir, start_step=step - 1, enabled=self.enabled)
        self._writer.write(record)
        writer = self.tensorboard() if self.enabled else None
        if writer is not None:
            from backends.samples.heatmap import samples_figure

            writer.add_figure(IMAGE_TAG, samples_figure(record, title=self.own), step, close=True)
            writer.flush()
