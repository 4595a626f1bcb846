"""Per-token estimators of KL(pi_theta || pi_ref) from sampled-token log-probs (Schulman).

With d = log pi_theta(y) - log pi_ref(y) and y ~ pi_theta (OpenRLHF's ``compute_approx_kl``,
verl's ``kl_penalty``):

- ``k1 = d``                      unbiased, high variance, can be negative;
- ``k2 = d^2 / 2``                biased, low variance, >= 0;
- ``k3 = exp(-d) - 1 + d``        unbiased, low variance, >= 0.

OpenRLHF clamps the estimate to [-10, 10] (and k3's d to >= -10); this module does not
clamp: the trainer rejects a non-finite loss instead.
"""

from __future__ import annotations

import torch

from backends.torch.config import KLEstimator


def kl_estimate(
    log_probs: torch.Tensor, ref_log_probs: torch.Tensor, estimator: KLEstimator
) -> torch.Tensor:
    """Per-token KL estimate, same shape as the inputs, float32 (or float64 for float64 input).

    Differentiable in ``log_probs``; ``ref_log_probs`` is treated as a constant by the caller.
    """
    if log_probs.shape != ref_log_probs.shape:
        raise ValueError(
            f"ref_log_probs: expected shape {tuple(log_probs.shape)} (as log_probs), "
            f"got {tuple(ref_log_probs.shape)}"
        )
    dtype = torch.promote_types(log_probs.dtype, torch.float32)
    d = log_probs.to(dtype) - ref_log_probs.to(dtype)
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d * d
    if estimator == "k3":
        return torch.expm1(-d) + d
    raise ValueError(f"kl_estimator: expected 'k1', 'k2' or 'k3', got {estimator!r}")
