"""``CreditPPOTrainer``: verl's synchronous V1 PPO trainer with token credit from
``credit_core`` (registered as ``trainer.v1.trainer_mode=credit_sync``).

Two steps of verl's ``PPOTrainer`` are extended, and its checkpoint carries the credit's
state:

- ``_compute_old_log_prob``: when the plan reads a signal the actor engine computes (W0,
  P2T's attribution, the direction model's attention or prefix rewards), the batch's
  ``extra_info`` carries the work request (``config.work_request``, formed once) for the
  duration of verl's own old-log-prob forward, so that ``CreditFSDPEngine`` computes them
  beside that forward (no extra policy forward) and verl's worker stores them in
  TransferQueue beside ``log_probs``.
- ``_compute_advantage``: under GRPO, verl's own (A_i broadcast over the response), then
  ``credit_fields`` replaces the stored ``advantages`` by the strategy's token advantages,
  which verl's ``ppo_loss`` reads per token. Under verl's critic estimator (GAE),
  ``credit_fields(..., critic=True)`` gives the strategy's token-reward shift D first (run
  on GRPO's advantages of the same rollouts), the stored scores become scores + D for the duration
  of verl's own ``_compute_advantage`` (its KL-in-reward, GAE and returns; the KL term is
  linear, so verl's token rewards are its stock ones + D), and the scores are put back.
  Both are ``credit_fields``: the process's one ``CreditRun.apply`` (``backends.verl.credit``); its
  ``credit/...`` metrics (the strategy's diagnostics and, for a strategy that reads a
  direction model, its agreement with verl's reward: ``credit/direction_agreement`` and
  its groups, with a gate its EMA and alpha, or ``credit/direction_is_reward``) join
  verl's metrics of the step. ``uniform`` leaves verl's step as it is (whatever the
  estimator; under GRPO ``credit_fields`` would give verl's advantages back bit for bit,
  and under GAE its D is exactly 0, both tested).
- ``_save_checkpoint`` / ``_load_checkpoint``: the run's state (the gate's EMA, only with a
  gate) is saved in verl's checkpoint folder of the step (``credit.pt``) and restored on
  resume; a gated run resumed from a checkpoint without it is refused, naming the file.

The credit keys are parsed and checked, and the run's ``CreditRun`` built (the strategy,
once), when the trainer is built (``credit_settings``): a strategy the backend cannot serve
stops the run before any worker starts. Once built, the
trainer sets ``trainer.v1.trainer_mode`` back to ``sync``: verl's own code compares it with
that name (replay buffer, refills, weight syncs), and this trainer is verl's synchronous one.
"""

from __future__ import annotations

import os
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
from backends.verl.credit import (
    credit_fields,
    fields_read,
    load_credit_state,
    save_credit_state,
)
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
        if self.credit.plan.name == "uniform":  # verl's advantages, any estimator
            return super()._compute_advantage(batch, metrics)
        if self.critic:
            return self._critic_advantage(batch, metrics)
        batch = super()._compute_advantage(batch, metrics)
        advantages, credit_metrics = credit_fields(self.credit, self._fields(batch, critic=False))
        metrics.update(credit_metrics)
        out = TensorDict({"advantages": advantages}, batch_size=len(batch))
        return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=out)

    def _critic_advantage(self, batch: Any, metrics: dict[str, Any]) -> Any:
        """verl's ``_compute_advantage`` (GAE) on the scores + the strategy's shift D."""
        fields = self._fields(batch, critic=True)
        shift, credit_metrics = credit_fields(self.credit, fields, critic=True)
        metrics.update(credit_metrics)
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

    def _save_checkpoint(self) -> None:
        folder = os.path.join(
            self.config.trainer.default_local_dir, f"global_step_{self.global_steps}"
        )
        save_credit_state(self.credit.run, folder)  # before verl marks the step's folder latest
        super()._save_checkpoint()

    def _load_checkpoint(self) -> None:
        super()._load_checkpoint()
        folder = resumed_folder(self.config, self.global_steps)
        if folder is not None:
            load_credit_state(self.credit.run, folder)

    def _fields(self, batch: Any, critic: bool) -> TensorDict:
        names = fields_read(self.credit, critic)
        found: TensorDict = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=names
        )
        return found


def resumed_folder(config: Any, global_steps: int) -> str | None:
    """verl's checkpoint folder that ``PPOTrainer._load_checkpoint`` resumed from, given the
    step it set (``global_steps``; 0: none, a fresh start): ``trainer.resume_from_path``
    under ``resume_mode: resume_path``, else the latest ``global_step_<n>`` of
    ``trainer.default_local_dir`` (relative paths from the working folder, as verl's)."""
    if global_steps == 0:
        return None
    trainer = config.trainer
    if trainer.resume_mode == "resume_path":
        return os.path.abspath(str(trainer.resume_from_path))
    return os.path.join(os.path.abspath(trainer.default_local_dir), f"global_step_{global_steps}")


def register_credit_trainer() -> None:
    """Register ``CreditPPOTrainer`` as ``trainer.v1.trainer_mode=credit_sync``."""
    register_trainer(TRAINER_MODE)(CreditPPOTrainer)
