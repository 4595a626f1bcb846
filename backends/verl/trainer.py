"""``CreditPPOTrainer``: verl's synchronous V1 PPO trainer with token advantages from
``credit_core`` (registered as ``trainer.v1.trainer_mode=credit_sync``).

Two steps of verl's ``PPOTrainer`` are extended, nothing else:

- ``_compute_old_log_prob``: when the plan reads W0, the batch's ``extra_info`` carries
  the work request (``config.work_request``, formed once) for the duration of verl's own
  old-log-prob forward, so that ``CreditFSDPEngine`` reduces W0 from that forward's logits
  (no extra policy forward) and verl's worker stores it in TransferQueue beside
  ``log_probs``.
- ``_compute_advantage``: verl's own (GRPO advantages A_i broadcast over the response),
  then ``credit_fields`` replaces the stored ``advantages`` by the strategy's token
  advantages, which verl's ``ppo_loss`` reads per token. ``credit/...`` diagnostics join
  verl's metrics. ``uniform`` leaves verl's advantages as they are (whatever the
  estimator; ``credit_fields`` would give them back bit for bit for GRPO, tested).

The credit keys are parsed and checked, and the run's ``CreditPlan`` built (the strategy,
once), when the trainer is built (``credit_settings``): a strategy the backend cannot serve
stops the run before any worker starts. Once built, the
trainer sets ``trainer.v1.trainer_mode`` back to ``sync``: verl's own code compares it with
that name (replay buffer, refills, weight syncs), and this trainer is verl's synchronous one.
"""

from __future__ import annotations

from typing import Any

import transfer_queue as tq
from tensordict import TensorDict
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from backends.verl.config import TRAINER_MODE, CreditSettings, credit_settings, work_request
from backends.verl.credit import credit_fields
from backends.verl.engine import WORK_FIELD, WORK_REQUEST_KEY

#: verl's name of the synchronous trainer, whose behaviour this trainer keeps.
SYNC_MODE = "sync"


class CreditPPOTrainer(PPOTrainerSync):  # type: ignore[misc]
    """``PPOTrainerSync`` whose advantages are ``algorithm.credit``'s token advantages."""

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        self.credit: CreditSettings = credit_settings(config)
        #: the old-log-prob batch's request for W0, None when the plan reads none
        self.work_request: str | None = (
            work_request(self.credit) if "unsigned_work" in self.credit.plan.signals else None
        )
        # verl selected this class by its registered name; verl's own code then branches on
        # trainer_mode == "sync" (replay buffer, refills, weight syncs): it is that trainer
        config.trainer.v1.trainer_mode = SYNC_MODE
        super().__init__(config, *args, **kwargs)

    def _compute_old_log_prob(self, batch: Any, metrics: dict[str, Any]) -> Any:
        if self.work_request is None:
            return super()._compute_old_log_prob(batch, metrics)
        batch.extra_info[WORK_REQUEST_KEY] = self.work_request
        try:
            return super()._compute_old_log_prob(batch, metrics)
        finally:
            batch.extra_info.pop(WORK_REQUEST_KEY, None)

    def _compute_advantage(self, batch: Any, metrics: dict[str, Any]) -> Any:
        batch = super()._compute_advantage(batch, metrics)
        plan = self.credit.plan
        if plan.name == "uniform":  # verl's advantages, any estimator
            return batch
        reads = plan.signals
        names = ["advantages", "response_mask", "responses"]
        if "unsigned_work" in reads:
            names.append(WORK_FIELD)
        if "token_entropy" in reads:
            names.append("entropy")
        fields = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=names
        )
        advantages, diagnostics = credit_fields(plan, fields)
        if diagnostics is not None:
            metrics.update(diagnostics.to_dict(prefix="credit/"))
        out = TensorDict({"advantages": advantages}, batch_size=len(batch))
        return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=out)


def register_credit_trainer() -> None:
    """Register ``CreditPPOTrainer`` as ``trainer.v1.trainer_mode=credit_sync``."""
    register_trainer(TRAINER_MODE)(CreditPPOTrainer)
