"""``CreditPPOTrainer``: verl's synchronous V1 PPO trainer with token credit from
``credit_core`` (registered as ``trainer.v1.trainer_mode=credit_sync``).

Two steps of verl's ``PPOTrainer`` are extended, nothing else:

- ``_compute_old_log_prob``: when the plan reads a signal the actor engine computes (W0,
  P2T's attribution, the direction model's attention or prefix rewards), the batch's
  ``extra_info`` carries the work request (``config.work_request``, formed once) for the
  duration of verl's own old-log-prob forward, so that ``CreditFSDPEngine`` computes them
  beside that forward (no extra policy forward) and verl's worker stores them in
  TransferQueue beside ``log_probs``.
- ``_compute_advantage``: under GRPO, verl's own (A_i broadcast over the response), then
  ``credit_fields`` replaces the stored ``advantages`` by the strategy's token advantages,
  which verl's ``ppo_loss`` reads per token. Under verl's critic estimator (GAE),
  ``critic_shift_fields`` gives the strategy's token-reward shift D first (run on GRPO's
  advantages of the same rollouts), the stored scores become scores + D for the duration
  of verl's own ``_compute_advantage`` (its KL-in-reward, GAE and returns; the KL term is
  linear, so verl's token rewards are its stock ones + D), and the scores are put back.
  ``credit/...`` diagnostics join verl's metrics. ``uniform`` leaves verl's step as it is
  (whatever the estimator; under GRPO ``credit_fields`` would give verl's advantages back
  bit for bit, and under GAE its D is exactly 0, both tested).

The credit keys are parsed and checked, and the run's ``CreditPlan`` built (the strategy,
once), when the trainer is built (``credit_settings``): a strategy the backend cannot serve
stops the run before any worker starts. Once built, the
trainer sets ``trainer.v1.trainer_mode`` back to ``sync``: verl's own code compares it with
that name (replay buffer, refills, weight syncs), and this trainer is verl's synchronous one.
"""

from __future__ import annotations

from typing import Any

import torch
import transfer_queue as tq
from tensordict import TensorDict
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from backends.verl.config import (
    TRAINER_MODE,
    CreditSettings,
    credit_settings,
    critic_estimator,
    work_request,
)
from backends.verl.credit import credit_fields, critic_shift_fields, fields_read
from backends.verl.engine import WORK_REQUEST_KEY

#: verl's name of the synchronous trainer, whose behaviour this trainer keeps.
SYNC_MODE = "sync"


class CreditPPOTrainer(PPOTrainerSync):  # type: ignore[misc]
    """``PPOTrainerSync`` whose advantages are ``algorithm.credit``'s token advantages."""

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        self.credit: CreditSettings = credit_settings(config)
        #: the old-log-prob batch's request for the engine's signals, None when none is read
        self.work_request: str | None = work_request(self.credit)
        #: whether verl's estimator is its critic's (GAE): the credit shifts token rewards
        self.critic: bool = critic_estimator(config)
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
        plan = self.credit.plan
        if plan.name == "uniform":  # verl's advantages, any estimator
            return super()._compute_advantage(batch, metrics)
        if self.critic:
            return self._critic_advantage(batch, metrics)
        batch = super()._compute_advantage(batch, metrics)
        fields = self._fields(batch, critic=False)
        advantages, diagnostics = credit_fields(plan, fields)
        if diagnostics is not None:
            metrics.update(diagnostics.to_dict(prefix="credit/"))
        out = TensorDict({"advantages": advantages}, batch_size=len(batch))
        return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=out)

    def _critic_advantage(self, batch: Any, metrics: dict[str, Any]) -> Any:
        """verl's ``_compute_advantage`` (GAE) on the scores + the strategy's shift D."""
        fields = self._fields(batch, critic=True)
        shift, diagnostics = critic_shift_fields(self.credit.plan, fields)
        if diagnostics is not None:
            metrics.update(diagnostics.to_dict(prefix="credit/"))
        scores = fields["rm_scores"]
        shifted = torch.nested.nested_tensor_from_jagged(
            scores.values() + shift.values().to(scores.dtype), scores.offsets()
        )
        self._put_scores(batch, shifted)
        try:
            return super()._compute_advantage(batch, metrics)
        finally:
            self._put_scores(batch, scores)

    @staticmethod
    def _put_scores(batch: Any, scores: torch.Tensor) -> None:
        fields = TensorDict({"rm_scores": scores}, batch_size=len(batch))
        tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=fields)

    def _fields(self, batch: Any, critic: bool) -> TensorDict:
        names = fields_read(self.credit.plan, critic)
        found: TensorDict = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=names
        )
        return found


def register_credit_trainer() -> None:
    """Register ``CreditPPOTrainer`` as ``trainer.v1.trainer_mode=credit_sync``."""
    register_trainer(TRAINER_MODE)(CreditPPOTrainer)
