"""The TRL backend's credit, in one place: what TRL provides (``BACKEND``, on which
``CreditGRPOConfig`` builds the run's plan once), and ``TrlCredit``, the credit of one
``CreditGRPOTrainer`` process on ``backends.common.credit.CreditRun``.

Per process there is one ``CreditRun`` of the run's plan (its one strategy instance, built
by ``CreditGRPOConfig``) and one of each compared strategy's (credit samples). Every token
advantage goes through ``TrlCredit.apply`` -> ``CreditRun.apply`` -> ``assign_credit``,
which runs the strategy on the rows with a valid token (TRL masks out truncated
completions), 0 elsewhere, and lets a process without such rows take part in the gather of
a batch-wide selection.

The direction model's agreement with the reward (docs/design.md, "Trusting the direction
model") is measured once per generation batch, in ``_generate_and_score_completions``,
where TRL knows the whole step in its order: TRL's groups are consecutive blocks of
``num_generations`` over every process's rows, which straddle processes when the per-device
batch is not a multiple of ``num_generations``, and in the loss phase TRL shuffles the rows
into micro-batches. So ``TrlCredit.measure`` takes the step's gathered rewards and
direction scores (identical on every process: no reduction needed), advances the gate's
EMA once per generation batch of a training step (once per optimizer step with TRL's
default ``steps_per_generation``; a look at an eval batch leaves it), and every later
``apply`` of that batch mixes at the gate's alpha (``CreditRun.apply(measured=True)``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from backends.common.credit import AgreementMetrics, CreditRun
from credit_core import (
    SIGNALS,
    CreditDiagnostics,
    CreditError,
    CreditResult,
    CreditSignals,
)
from credit_core.agreement_gate import GateConfig
from credit_core.batch import TRAINED_MODEL_SIGNALS, Gather
from credit_core.plan import Backend, CreditPlan

#: What the TRL backend provides: every signal but a second trained model's and the
#: policy's own answer-span gradient; the step's rewards and groups (``TrlCredit.groups``:
#: every strategy that reads them forms its credit at generation time, where TRL's groups
#: are known) and the reward functions' token rewards (``backends.trl.token_rewards``), no
#: answer span; its reward gradient is known before the policy's forward (W0 streamed)
#: except on a path (``backends.trl.trainer``).
BACKEND = Backend(
    "TRL",
    "credit",
    SIGNALS - TRAINED_MODEL_SIGNALS - {"answer_saliency"},
    frozenset({"gather", "path_gradient", "groups", "token_rewards"}),
    work_first=True,
    path_work=False,
    hint="train it with the native trainer (python -m backends.torch, docs/backends.md)",
)

#: File of a checkpoint folder that holds the strategy's mutable state (when it has one) of a
#: one-process run; with several processes, each writes ``credit_strategy_<rank>.pt``.
STRATEGY_STATE_FILE = "credit_strategy.pt"
#: File of a checkpoint folder that holds the run's credit state (the agreement gate's EMA,
#: the same on every process), written only with ``credit.gate``.
RUN_STATE_FILE = "credit_run.pt"

#: A TRL metrics dict (``GRPOTrainer._metrics[mode]``): key -> values since the last log.
Metrics = Mapping[str, list[float]]


def process_gather(accelerator: Any) -> Gather | None:
    """A ``credit_core`` ``Gather`` over ``accelerator``'s processes (None for one process):
    each process's 1-D values concatenated in process order, whatever their lengths. The
    lengths are gathered first, the values padded to the longest and gathered as float64
    (exact for float32 and float64 values), the padding dropped, and the result cast back
    to the caller's dtype; so a process with nothing to contribute takes part with an
    empty tensor of any floating dtype. Every process must call it the same number of
    times (it runs two collectives)."""
    if accelerator.num_processes == 1:
        return None

    def gather(values: torch.Tensor) -> torch.Tensor:
        count = torch.tensor([values.numel()], dtype=torch.long, device=values.device)
        counts = accelerator.gather(count).tolist()
        longest = max(counts)
        if longest == 0:
            return values
        padded = torch.zeros(longest, dtype=torch.float64, device=values.device)
        padded[: values.numel()] = values
        rows = accelerator.gather(padded).reshape(len(counts), longest)
        joined = torch.cat([row[:n] for row, n in zip(rows, counts, strict=True)])
        return joined.to(values.dtype)

    return gather


class TrlCredit:
    """The credit of one ``CreditGRPOTrainer`` process.

    ``run``: the ``CreditRun`` of ``plan`` (the config's, built once) with ``gate``;
    ``direction_is_reward``: TRL's reward is the direction model's own score (its only
    reward function), so the agreement is 1 by construction (and a gate refused).
    ``compare``: (label, plan) of the compared strategies, each given its own ungated run.
    ``accelerator``: TRL's, for the gathers and reductions over processes.
    """

    def __init__(
        self,
        plan: CreditPlan,
        gate: GateConfig | None,
        compare: Sequence[tuple[str, CreditPlan]],
        accelerator: Any,
        *,
        direction_is_reward: bool,
    ) -> None:
        self.run = CreditRun(
            plan, gate, direction_is_reward=direction_is_reward, measures_apart=True
        )
        self.compare = [(label, CreditRun(theirs)) for label, theirs in compare]
        self.accelerator = accelerator
        self.gather = process_gather(accelerator)

    def apply(
        self,
        batch: Mapping[str, Any],
        mask: torch.Tensor,
        signals: CreditSignals,
        run: CreditRun | None = None,
        *,
        groups: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> CreditResult:
        """The token advantages (B, T) float32 of ``batch`` (TRL's: ``advantages`` (B,),
        ``completion_ids`` (B, T)) under the loss ``mask`` (B, T) bool with ``signals``, by
        ``run`` (default: the run's own), 0 where ``mask`` is False; rows without a valid
        token get 0 and NaN diagnostics (``credit_core.allocation.EMPTY_DIAGNOSTICS``). The batch's
        agreement was measured when it was generated (``measure``): a gate mixes at its
        current alpha. ``groups``: (rewards (B,), groups (B,) int64) of ``batch``'s rows,
        for a strategy that reads them (given at generation time: ``groups``)."""
        rewards, ids = (None, None) if groups is None else groups
        step = (run or self.run).apply(
            batch["advantages"],
            mask,
            batch["completion_ids"].long(),
            signals,
            rewards=rewards,
            groups=ids,
            gather=self.gather,
            measured=True,
        )
        return step.result

    def groups(self, rows: int, group_size: int) -> torch.Tensor:
        """The groups (rows,) int64 of this process's ``rows`` rows of a generation batch:
        TRL's groups are consecutive blocks of ``group_size`` (``num_generations``) over
        every process's rows in process order (``check_whole_groups`` first)."""
        self.check_whole_groups(rows, group_size)
        start = self.accelerator.process_index * rows
        index = torch.arange(start, start + rows, device=self.accelerator.device)
        return index // group_size

    def check_whole_groups(self, rows: int, group_size: int) -> None:
        """``CreditError`` when TRL's groups of ``group_size`` would straddle processes
        whose generation batches hold ``rows`` rows each (not a multiple, with several
        processes): a group's statistics would then need the other processes' rows."""
        if self.accelerator.num_processes > 1 and rows % group_size != 0:
            raise CreditError(
                f"credit: strategy {self.run.plan.name!r} reads the step's groups, but each "
                f"process's generation batch ({rows} rows: per_device_train_batch_size x "
                f"steps_per_generation, or per_device_eval_batch_size) is not a multiple of "
                f"num_generations ({group_size}), so TRL's groups straddle processes; make it "
                "a multiple"
            )

    def measure(
        self,
        scores: torch.Tensor | None,
        rewards: torch.Tensor | None,
        group_size: int,
        *,
        advance: bool,
    ) -> AgreementMetrics | None:
        """The generation batch's ``AgreementMetrics`` (None for a strategy that reads no
        direction model): the within-group agreement of the direction model's ``scores``
        (N,) with TRL's ``rewards`` (N,) over every process's rows in TRL's order (groups:
        consecutive blocks of ``group_size``), rows where either is NaN (unscorable) left
        out; ``advance``: the gate's EMA takes this measure (a training batch)."""
        run = self.run
        if not run.measures or run.direction_is_reward:
            return run.measure(None, None, None)
        if scores is None or rewards is None:
            raise RuntimeError(
                "TrlCredit.measure: the step's direction scores or rewards are missing"
            )
        rewards = rewards.to(scores.device)
        keep = torch.isfinite(scores) & torch.isfinite(rewards)
        if not bool(keep.any()):  # no scorable row: no group, the EMA stays
            gate = run.gate
            if gate is None:
                return AgreementMetrics(False)
            return AgreementMetrics(False, math.nan, 0, 0, gate.ema, gate.alpha)
        groups = torch.arange(scores.numel(), device=scores.device) // group_size
        return run.measure(scores[keep], rewards[keep], groups[keep], advance=advance)

    def log_agreement(self, metrics: Metrics, agreement: AgreementMetrics | None) -> None:
        """Append ``agreement``'s metrics (``AgreementMetrics.to_dict``: the same on every
        process) to TRL's ``metrics``; a NaN (no group used yet) is left out, so TRL's mean
        over a logging window averages the measured batches."""
        if agreement is None:
            return
        for key, value in agreement.to_dict().items():
            if not math.isnan(value):
                metrics[key].append(value)

    def log_diagnostics(self, metrics: Metrics, diagnostics: CreditDiagnostics) -> None:
        """Append ``diagnostics`` reduced over processes to TRL's ``metrics``: max of
        ``weight_max``, min of ``weight_min``, mean of the fractions, sum of the fallbacks;
        a process without valid rows (NaN ``weight_max``) contributes nothing."""
        names = ("weight_max", "weight_min", "weight_entropy", "frac_upweighted")
        local = [
            *(float(getattr(diagnostics, n)) for n in names),
            float(diagnostics.nonfinite_fallbacks),
            float(diagnostics.uniform_fallbacks),
        ]
        device = self.accelerator.device
        values = self.accelerator.gather(torch.tensor([local], device=device)).reshape(-1, 6)
        valid = values[~values[:, 0].isnan()]
        if valid.shape[0] == 0:
            return
        reduced = CreditDiagnostics(
            weight_max=float(valid[:, 0].max()),
            weight_min=float(valid[:, 1].min()),
            weight_entropy=float(valid[:, 2].mean()),
            frac_upweighted=float(valid[:, 3].mean()),
            nonfinite_fallbacks=int(valid[:, 4].sum()),
            uniform_fallbacks=int(valid[:, 5].sum()),
        )
        for key, value in reduced.to_dict(prefix="credit/").items():
            metrics[key].append(value)

    # ---------------------------------------------------------------------- checkpoints

    def _strategy_state_file(self) -> str:
        """``STRATEGY_STATE_FILE``; with several processes, this process's own file (each
        process's stream advances with the shape of its own batches)."""
        if self.accelerator.num_processes == 1:
            return STRATEGY_STATE_FILE
        return f"credit_strategy_{self.accelerator.process_index}.pt"

    def save(self, folder: str, *, should_save: bool) -> None:
        """Into checkpoint ``folder``: the strategy's mutable state (``datc_shuffled``'s and
        ``random_top``'s random streams), when it has any, by every process in its own
        file; the run's state (the gate's EMA), with a gate, by the process that saves."""
        strategy = self.run.strategy.state_dict()
        run = self.run.state_dict()
        if not strategy and not (run and should_save):
            return
        os.makedirs(folder, exist_ok=True)
        if strategy:
            torch.save(strategy, os.path.join(folder, self._strategy_state_file()))
        if run and should_save:
            torch.save(run, os.path.join(folder, RUN_STATE_FILE))

    def load(self, folder: str) -> None:
        """Restore what ``save`` wrote into ``folder``. A gated run resumed from a
        checkpoint without the gate's state, or a checkpoint with it resumed without a
        gate, raises ``CreditError`` naming the mismatch (``CreditRun.load_state_dict``)."""
        path = os.path.join(folder, self._strategy_state_file())
        if os.path.exists(path):
            self.run.strategy.load_state_dict(torch.load(path, weights_only=True))
        path = os.path.join(folder, RUN_STATE_FILE)
        saved = os.path.exists(path)
        if saved or self.run.gate is not None:
            state = torch.load(path, weights_only=True) if saved else {}
            self.run.load_state_dict(state)
