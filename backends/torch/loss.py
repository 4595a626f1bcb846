"""The PPO clipped policy loss and the three loss aggregations.

Per token, with r = exp(log pi_theta - log pi_old) and token advantage A_t
(OpenRLHF ``PolicyLoss``, verl ``compute_policy_loss``, asymmetric clip as in DAPO):

    loss_t = -min(r A_t, clip(r, 1 - eps_low, 1 + eps_high) A_t)

Aggregation of a per-token matrix l (B, T) with mask m over ONE optimizer step's batch. The
batch is split into micro-batches (and ranks), so the denominators are the step's global
totals (``LossNormalizer``) and the micro-batch losses add up to the step's loss:

- ``token_mean``:              sum_{i,t} m l / sum_{i,t} m
  (OpenRLHF token_level_loss=True, verl "token-mean");
- ``seq_mean_token_mean``:     (1/B) sum_i (sum_t m l / n_i)
  (OpenRLHF token_level_loss=False, verl "seq-mean-token-mean", the GRPO paper's form);
- ``seq_mean_token_sum_norm``: (1/B) sum_i sum_t m l / L, L a constant (max_new_tokens)
  (Dr. GRPO). verl's "seq-mean-token-sum-norm" computes sum_{i,t} m l / T_pad per
  micro-batch, i.e. B_micro times this value when T_pad = L, with the 1/B folded elsewhere.

The critic's clipped value loss (``algorithm.estimator: gae``; verl ``compute_value_loss``,
OpenRLHF ``ValueLoss``), per token, with new values V, old values V_old, returns R and
clip c:

    loss_t = 0.5 * max((V_t - R_t)^2, (clip(V_t, V_old_t - c, V_old_t + c) - R_t)^2)

aggregated like the policy loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from backends.torch.config import LossAgg


@dataclass(frozen=True)
class LossNormalizer:
    """Global denominators of one optimizer step: valid tokens, responses, constant length."""

    num_tokens: float
    num_seqs: float
    max_len: int

    def __post_init__(self) -> None:
        if self.num_tokens <= 0 or self.num_seqs <= 0 or self.max_len <= 0:
            raise ValueError(f"LossNormalizer: expected positive totals, got {self}")


def aggregate(
    values: torch.Tensor, mask: torch.Tensor, mode: LossAgg, norm: LossNormalizer
) -> torch.Tensor:
    """This micro-batch's share of the step loss: a scalar (see the module docstring).

    ``values`` (B, T) floating; ``mask`` (B, T) bool (each row has at least one True for
    ``seq_mean_token_mean``). Masked positions contribute exactly 0, even if non-finite.
    """
    if values.shape != mask.shape:
        raise ValueError(
            f"mask: expected shape {tuple(values.shape)} (as the loss), got {tuple(mask.shape)}"
        )
    masked = torch.where(mask, values, torch.zeros((), dtype=values.dtype, device=values.device))
    if mode == "token_mean":
        return masked.sum() / norm.num_tokens
    if mode == "seq_mean_token_mean":
        per_seq = masked.sum(dim=1) / mask.sum(dim=1).clamp_min(1).to(values.dtype)
        return per_seq.sum() / norm.num_seqs
    if mode == "seq_mean_token_sum_norm":
        return masked.sum() / (norm.max_len * norm.num_seqs)
    raise ValueError(
        "loss_agg: expected 'token_mean', 'seq_mean_token_mean' or 'seq_mean_token_sum_norm', "
        f"got {mode!r}"
    )


@dataclass(frozen=True)
class PPOTerms:
    """Per-token outputs of ``ppo_clip_loss``, all (B, T)."""

    loss: torch.Tensor
    clipped: torch.Tensor  # bool: the clipped surrogate was the active (smaller) one
    log_ratio: torch.Tensor  # log pi_theta - log pi_old, detached


def ppo_clip_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_eps_low: float,
    clip_eps_high: float,
) -> PPOTerms:
    """Per-token clipped surrogate loss; differentiable in ``log_probs``. Shapes (B, T)."""
    for name, tensor in (("old_log_probs", old_log_probs), ("advantages", advantages)):
        if tensor.shape != log_probs.shape:
            raise ValueError(
                f"{name}: expected shape {tuple(log_probs.shape)} (as log_probs), "
                f"got {tuple(tensor.shape)}"
            )
    log_ratio = log_probs - old_log_probs
    ratio = log_ratio.exp()
    surr1 = ratio * advantages
    surr2 = ratio.clamp(1.0 - clip_eps_low, 1.0 + clip_eps_high) * advantages
    return PPOTerms(
        loss=-torch.minimum(surr1, surr2), clipped=surr2 < surr1, log_ratio=log_ratio.detach()
    )


@dataclass(frozen=True)
class ValueTerms:
    """Per-token outputs of ``clipped_value_loss``, all (B, T)."""

    loss: torch.Tensor
    clipped: torch.Tensor  # bool: the clipped value's error was the larger (active) one


def clipped_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, *, clip: float
) -> ValueTerms:
    """Per-token clipped value loss (module docstring); differentiable in ``values``.

    ``values``, ``old_values`` (the critic's before this step's updates) and ``returns``
    (B, T) floating; ``clip`` > 0.
    """
    for name, tensor in (("old_values", old_values), ("returns", returns)):
        if tensor.shape != values.shape:
            raise ValueError(
                f"{name}: expected shape {tuple(values.shape)} (as values), "
                f"got {tuple(tensor.shape)}"
            )
    if not clip > 0:
        raise ValueError(f"clip: expected a value > 0, got {clip!r}")
    clipped_values = torch.maximum(torch.minimum(values, old_values + clip), old_values - clip)
    plain = (values - returns) ** 2
    clipped = (clipped_values - returns) ** 2
    return ValueTerms(loss=0.5 * torch.maximum(plain, clipped), clipped=clipped > plain)
