"""PRIME's implicit PRM pi_phi in the native trainer (docs/design.md, "Implicit process rewards
(PRIME)"): a second trainable language model, a copy of the reference policy, updated once per
step on that step's rollouts with the outcome labels.

The credit reads q_t = log pi_phi(y_t) - log pi_ref(y_t) from a no-grad pass of pi_phi
(``backends.torch.credit.CreditPath.old_policy_pass``) and the reference log-probs the trainer
already has; after the credit, ``ImplicitPRM.update`` takes one optimizer step of the mean
cross-entropy ``credit_core.implicit_rewards.implicit_prm_loss`` over the step's responses
(all ranks), micro-batched, with its own optimizer and gradient clip. Its weights and optimizer
state are checkpointed beside the policy's (``TrainingState.extra``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from adapters.policy import response_logprobs_and_stats
from backends.torch.distributed import DistContext, grad_sync, root_gathered
from backends.torch.rollout import RolloutBatch
from credit_core.implicit_rewards import implicit_prm_loss
from credit_core.trained_model import ImplicitPRMSpec

#: The key of pi_phi's model and optimizer state in a checkpoint's ``TrainingState.extra``.
CHECKPOINT_KEY = "implicit_prm"


@dataclass(frozen=True)
class PRMUpdate:
    """One update of pi_phi: the step's mean cross-entropy before the update (all ranks),
    the gradient norm before clipping, and the share of responses whose implicit score
    beta sum_t q_t has the sign of its label (label > 1/2 against score > 0)."""

    loss: float
    grad_norm: float
    accuracy: float

    def metrics(self) -> dict[str, float]:
        return {
            "implicit_prm/loss": self.loss,
            "implicit_prm/grad_norm": self.grad_norm,
            "implicit_prm/accuracy": self.accuracy,
        }


class ImplicitPRM:
    """pi_phi (``model``: the wrapped ``PolicyModule`` of a copy of the reference policy) and
    its ``optimizer``; ``spec`` gives beta and the gradient clip. ``temperature`` is the
    rollout temperature at which both log-probs of q are taken (the reference pass's)."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        spec: ImplicitPRMSpec,
        ctx: DistContext,
        *,
        temperature: float,
        micro_batch_size: int,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.spec = spec
        self.ctx = ctx
        self.temperature = temperature
        self.micro_batch_size = micro_batch_size

    @staticmethod
    def build_optimizer(model: torch.nn.Module, spec: ImplicitPRMSpec) -> torch.optim.Optimizer:
        """AdamW at ``spec.lr``, weight decay 0, constant (the recipe's ``optim``)."""
        return torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.0)

    def update(
        self, batch: RolloutBatch, ref_logp: torch.Tensor, labels: torch.Tensor
    ) -> PRMUpdate:
        """One optimizer step on this rank's rows of the step: ``batch`` (B responses, R
        columns), the reference log-probs ``ref_logp`` (B, R) (no grad, 0 at padding) and the
        outcome labels ``labels`` (B,) in [0, 1]. The loss is the mean over the step's
        responses on every rank, so the gradient is the one-process gradient of the whole
        step (DDP's mean over ranks undone, as in the policy update)."""
        n_total = float(
            self.ctx.all_reduce_sum(
                torch.tensor(
                    [float(batch.size)], dtype=torch.float64, device=self.ctx.collective_device
                )
            )[0]
        )
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum, right = 0.0, 0.0
        micro = list(batch.micro_batches(self.micro_batch_size))
        for i, (rows, mb) in enumerate(micro):
            R, mask = mb.response_len, mb.response_mask
            with root_gathered(self.model, reshard=False):
                logp, _ = response_logprobs_and_stats(
                    self.model, mb.input_ids, mb.attention_mask, R, temperature=self.temperature
                )
            q = logp - ref_logp[rows, :R].to(logp.dtype)
            mb_labels = labels[rows].to(logp.device)
            losses = implicit_prm_loss(q, mask, mb_labels, self.spec.beta)
            with grad_sync(self.model, i == len(micro) - 1):
                (losses.sum() / n_total * self.ctx.world_size).backward()  # type: ignore[no-untyped-call]
            score = torch.where(mask, q.detach(), 0.0).sum(dim=1)
            loss_sum += float(losses.detach().sum())
            right += float(((score > 0) == (mb_labels > 0.5)).sum())
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, self.spec.grad_clip)
        grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        totals = self.ctx.all_reduce_sum(
            torch.tensor([loss_sum, right], dtype=torch.float64, device=self.ctx.collective_device)
        )
        loss = float(totals[0]) / n_total
        if not math.isfinite(loss) or not math.isfinite(grad_norm):  # the same on every rank
            raise FloatingPointError(
                f"implicit PRM: non-finite loss ({loss}) or gradient norm ({grad_norm}); "
                "lower the strategy's prm_lr or beta"
            )
        self.optimizer.step()
        return PRMUpdate(loss, grad_norm, float(totals[1]) / n_total)
