"""Run logging: JSONL metrics, TensorBoard event files and a terminal progress bar.

``metrics.jsonl`` holds one object per logged step: ``{"step": k, "<name>": value, ...}``.
On resume from step k, records after k are dropped (the interrupted run may have logged
steps it never checkpointed; from step 0, all of them) and TensorBoard purges events after k.
A last line cut short by a kill is left out.

The trainer's metrics (all global: reduced over ranks):

- ``reward/{mean,std,min,max}``, ``advantage/abs_mean``: the step's rollouts.
- ``eval/reward_sampled`` (mean over G samples per held-out prompt at the training
  temperature), ``eval/reward_greedy``, ``eval/length_*``: at eval steps (and step 0).
- ``kl/ref``: per-token KL estimate (the configured k1/k2/k3) of the rollout policy to the
  reference, when ``kl_coef > 0``; ``ppo/approx_kl``: mean of log pi_old - log pi_theta over
  the update's micro-batches; ``ppo/clip_frac``: fraction of tokens where the clipped
  surrogate was active.
- ``policy/entropy``: the sampled-token estimate of the per-token entropy at the rollout
  temperature, mean over tokens of -log p_old(y_t) (unbiased; no extra LM-head pass).
- ``response/length_mean``, ``response/truncated_frac`` (no EOS within max_new_tokens).
- ``loss/{policy,kl,total}``: mean over the step's optimizer updates.
- ``credit/*``: the strategy's ``CreditDiagnostics``, merged exactly over ranks.
- ``signals/reward_grad_rows``, ``signals/policy_stats_rows``: responses for which the RM
  gradient / the policy statistics were computed (0 for ``uniform``).
- ``rm/*``, ``bridge/*``: the reward adapters' diagnostics (mean per RM call).
- ``implicit_prm/{loss,grad_norm,accuracy}``: with ``prime``, pi_phi's update of the step
  (``backends.torch.implicit_prm.PRMUpdate``; its time counts in ``time/update``).
- ``time/{rollout,signals,update,step}`` (slowest rank), ``throughput/tokens_per_s``
  (response tokens per second of step time), ``optim/{lr,grad_norm}``.
- ``time/credit_samples``: at a step whose credit samples are recorded
  (``backends.torch.credit_samples``), the seconds that took (not part of ``time/step``).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from tqdm import tqdm

from backends.common.jsonl import truncate_jsonl

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
TB_DIR = "tensorboard"

#: Metrics shown on the progress bar, with their short labels.
PROGRESS_KEYS = {"reward/mean": "reward", "eval/reward_sampled": "eval", "kl/ref": "kl"}


class MetricsLogger:
    """Writes metrics on the logging rank; a no-op (except ``history``) elsewhere.

    ``history`` keeps every record logged by this process, for in-process callers.
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        total_steps: int,
        start_step: int,
        enabled: bool,
        tensorboard: bool,
        progress: bool,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.enabled = enabled
        self.history: list[dict[str, Any]] = []
        self._writer: Any = None
        self._bar: Any = None
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # records the resumed run logs again go: those after start_step (all from step 0)
        truncate_jsonl(self.run_dir / METRICS_FILE, start_step if start_step else -1)
        self._file = open(self.run_dir / METRICS_FILE, "a", encoding="utf-8")  # noqa: SIM115
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            purge_all = 0 if (self.run_dir / TB_DIR).exists() else None  # restart from 0

            self._writer = SummaryWriter(
                log_dir=str(self.run_dir / TB_DIR),
                purge_step=start_step + 1 if start_step else purge_all,
            )
        self._bar = tqdm(
            total=total_steps,
            initial=start_step,
            disable=not progress,
            unit="step",
            dynamic_ncols=True,
        )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record ``metrics`` for ``step`` (finite or not, as measured)."""
        record: dict[str, Any] = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        self.history.append(record)
        if not self.enabled:
            return
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._writer is not None:
            for key, value in record.items():
                if key != "step" and math.isfinite(value):
                    self._writer.add_scalar(key, value, step)
            self._writer.flush()
        shown = {label: f"{metrics[k]:.3f}" for k, label in PROGRESS_KEYS.items() if k in metrics}
        if shown:
            self._bar.set_postfix(shown, refresh=False)

    @property
    def draws_figures(self) -> bool:
        """Whether ``log_figure`` writes anything (TensorBoard is on, on this rank)."""
        return self._writer is not None

    def log_figure(self, tag: str, figure: Any, step: int) -> None:
        """Log a matplotlib ``figure`` to TensorBoard as an image under ``tag``; closes it."""
        if self._writer is None:
            raise RuntimeError("MetricsLogger.log_figure: TensorBoard is off on this rank")
        self._writer.add_figure(tag, figure, step, close=True)
        self._writer.flush()

    def advance(self) -> None:
        """Move the progress bar one step."""
        if self._bar is not None:
            self._bar.update(1)

    def close(self) -> None:
        if not self.enabled:
            return
        self._file.close()
        if self._writer is not None:
            self._writer.close()
        self._bar.close()
