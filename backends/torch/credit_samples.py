"""Credit samples in the native trainer (the config's ``credit_samples`` section).

At a recorded step (every ``interval`` steps and the last; by default at every evaluation
step), between the credit phase and the update, so at the policy that sampled the batch,
``CreditSampleRecorder.record`` takes ``count`` responses of this rank's batch: from the
prompt groups in batch order (those whose advantages are not all 0 first), the highest and
the lowest A of each group, until ``count``. Their token advantages are the step's own;
each compared strategy's come from ``GRPORecipe.signals`` (the one credit path) run on
those responses' groups only (A is relative to the group) with that strategy and its
reward side (``backends.torch.compare``). Recording draws no random numbers: the run is
the same with or without it.

Rank 0 appends the record to the run folder's ``credit_samples.jsonl``
(``backends.samples.records``) and, with TensorBoard on, logs its heat-map as the image
``credit/samples``; every rank computes the compared credits (FSDP's forwards are
collective). A recorded step reports ``time/credit_samples``, the seconds it took.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from time import perf_counter

import torch
from transformers import PreTrainedTokenizerBase

from backends.common.data import Prompt
from backends.common.errors import ConfigError
from backends.samples.heatmap import samples_figure
from backends.samples.records import (
    SamplesWriter,
    StepAgreement,
    StepSamples,
    pick_rows,
    response_samples,
)
from backends.torch.compare import CompareCredit, compare_credit
from backends.torch.config import TrainConfig
from backends.torch.metrics import MetricsLogger
from backends.torch.models import Policy
from backends.torch.rollout import RolloutBatch, pad_responses
from backends.torch.rollout_rewards import RolloutRewards
from backends.torch.step import StepSignals
from credit_core import get_strategy

#: ``GRPORecipe.signals``: (batch, pool, strategy=..., rewards=...) -> StepSignals.
CreditPath = Callable[..., StepSignals]

#: The TensorBoard image tag of the heat-map.
IMAGE_TAG = "credit/samples"


class CreditSampleRecorder:
    """Records the credit samples of the steps that are due (see the module docstring)."""

    def __init__(
        self,
        *,
        interval: int,
        total_steps: int,
        count: int,
        group_size: int,
        own: str,
        compare: Sequence[CompareCredit],
        credit: CreditPath,
        tokenizer: PreTrainedTokenizerBase,
        writer: SamplesWriter,
        logger: MetricsLogger,
    ) -> None:
        self.interval = interval
        self.total_steps = total_steps
        self.count = count
        self.group_size = group_size
        self.own = own
        self.compare = list(compare)
        self.credit = credit
        self.tokenizer = tokenizer
        self.writer = writer
        self.logger = logger

    def due(self, step: int) -> bool:
        """Whether ``step`` (>= 1) is recorded: every ``interval`` steps and the last."""
        return self.interval > 0 and (step % self.interval == 0 or step == self.total_steps)

    def record(self, step: int, signals: StepSignals, pool: Sequence[Prompt]) -> dict[str, float]:
        """Record ``step``'s samples from ``signals`` (whose batch's ``group`` indexes
        ``pool``) if it is due; ``{"time/credit_samples": seconds}`` then, else ``{}``."""
        if not self.due(step):
            return {}
        start = perf_counter()
        batch = signals.batch
        rows = pick_rows(signals.advantages, self.group_size, self.count)
        token_adv = {self.own: signals.token_advantages[rows]}
        token_adv.update(self._compared(batch, rows, pool))
        record = StepSamples(
            step=step,
            strategy=self.own,
            compare=[c.label for c in self.compare],
            samples=response_samples(
                prompts=[pool[g].text for g in batch.group[rows].tolist()],
                tokens=[
                    [str(self.tokenizer.decode([t])) for t in batch.response_ids[r][m].tolist()]
                    for r, m in zip(rows, batch.response_mask[rows], strict=True)
                ],
                rewards=signals.rewards[rows],
                advantages=signals.advantages[rows],
                token_advantages=token_adv,
                mask=batch.response_mask[rows],
            ),
            agreement=None if signals.agreement is None else StepAgreement.of(signals.agreement),
        )
        self.writer.write(record)
        if self.logger.draws_figures:
            self.logger.log_figure(IMAGE_TAG, samples_figure(record, title=self.own), step)
        return {"time/credit_samples": perf_counter() - start}

    def _compared(
        self, batch: RolloutBatch, rows: list[int], pool: Sequence[Prompt]
    ) -> dict[str, torch.Tensor]:
        """Each compared strategy's token advantages (len(rows), R) of ``rows``, computed on
        their groups only."""
        if not self.compare:
            return {}
        G = self.group_size
        groups = sorted({r // G for r in rows})
        sub_rows = [g * G + i for g in groups for i in range(G)]
        sub = batch.select(torch.tensor(sub_rows))
        at = torch.tensor([sub_rows.index(r) for r in rows])
        out = {}
        for c in self.compare:
            theirs = self.credit(sub, pool, strategy=c.strategy, rewards=c.reward)
            out[c.label] = pad_responses(theirs.token_advantages, batch.response_len)[at]
        return out


def build_recorder(
    cfg: TrainConfig,
    *,
    reward: RolloutRewards,
    policy: Policy,
    credit: CreditPath,
    start_step: int,
    is_main: bool,
    logger: MetricsLogger,
) -> CreditSampleRecorder:
    """The recorder of ``cfg.credit_samples`` for a run with ``reward`` and ``policy``,
    resuming after ``start_step``; ``ConfigError`` naming a compared strategy that this run
    cannot compute (no direction model)."""
    section = cfg.credit_samples
    compare = []
    for i, c in enumerate(section.compare):
        if c.label == cfg.credit.label:  # the run's own row shows it
            continue
        key = f"credit_samples.compare.{i}"
        strategy = get_strategy(c)
        if strategy.requires and reward.direction is None:
            raise ConfigError(
                f"{key}: strategy {c.name!r} needs a differentiable reward model "
                "(reward.direction_model), but the config has none"
            )
        label = c.label
        compare.append(compare_credit(label, c, reward))
    interval = cfg.eval.interval if section.interval is None else section.interval
    return CreditSampleRecorder(
        interval=interval,
        total_steps=cfg.steps,
        count=section.count,
        group_size=cfg.rollout.group_size,
        own=cfg.credit.label,
        compare=compare,
        credit=credit,
        tokenizer=policy.tokenizer,
        writer=SamplesWriter(cfg.output_dir, start_step=start_step, enabled=is_main),
        logger=logger,
    )
