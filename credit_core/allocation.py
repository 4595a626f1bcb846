"""Turning per-token scores into token advantages that keep sign and per-response mean."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal, get_args

import torch

from credit_core.errors import CreditError
from credit_core.tensor_checks import check_tensor

NonFinitePolicy = Literal["error", "uniform"]

RMS_EPS = 1e-8


@dataclass(frozen=True)
class CreditDiagnostics:
    """Batch-level summary of one ``assign`` call, for logging.

    - ``weight_max``: largest token weight w_t in the batch.
    - ``weight_min``: smallest token weight over valid tokens.
    - ``weight_entropy``: mean over responses of the entropy of w/n over valid tokens,
      divided by log(n) (1 = uniform; responses with n = 1 count as 1).
    - ``frac_upweighted``: fraction of valid tokens with w_t > 1.
    - ``nonfinite_fallbacks``: responses whose scores were non-finite and fell back to w = 1.
    - ``uniform_fallbacks``: responses given w = 1 for want of a signal (no selected token,
      no attention mass on the response, a single token; docs/design.md, "Baselines").
    """

    weight_max: float
    weight_min: float
    weight_entropy: float
    frac_upweighted: float
    nonfinite_fallbacks: int
    uniform_fallbacks: int = 0

    def to_dict(self, prefix: str = "credit/") -> dict[str, float]:
        """Flat ``{prefix + field: value}`` for metric loggers."""
        return {prefix + k: float(v) for k, v in asdict(self).items()}


#: Diagnostics of w = 1 on every valid token.
UNIFORM_DIAGNOSTICS = CreditDiagnostics(1.0, 1.0, 1.0, 0.0, 0)
#: Diagnostics of a batch without a valid token: nothing to summarize (NaN), no fallback.
EMPTY_DIAGNOSTICS = CreditDiagnostics(math.nan, math.nan, math.nan, math.nan, 0, 0)


def weight_diagnostics(
    weights: torch.Tensor, mask: torch.Tensor, fallbacks: int, uniform_fallbacks: int = 0
) -> CreditDiagnostics:
    """``CreditDiagnostics`` of token weights (B, T) (0 at padding) over ``mask`` (B, T)."""
    n = mask.sum(dim=1).to(weights.dtype)
    valid = weights[mask]
    share = weights / n.unsqueeze(1)
    plogp = torch.where(mask & (share > 0), share * torch.log(share.clamp_min(1e-30)), 0.0)
    entropy = -plogp.sum(dim=1)
    log_n = torch.log(n)
    norm_entropy = torch.where(n > 1, entropy / log_n.clamp_min(1e-30), torch.ones_like(n))
    return CreditDiagnostics(
        weight_max=float(valid.max()),
        weight_min=float(valid.min()),
        weight_entropy=float(norm_entropy.mean()),
        frac_upweighted=float((valid > 1.0 + 1e-6).float().mean()),
        nonfinite_fallbacks=fallbacks,
        uniform_fallbacks=uniform_fallbacks,
    )


def _check_allocation_args(
    scores: torch.Tensor,
    mask: torch.Tensor,
    beta: float,
    lam: float,
    on_nonfinite: str,
    score_name: str,
) -> None:
    check_tensor(score_name, scores, (None, None))
    check_tensor("mask", mask, tuple(scores.shape), dtype=torch.bool, device=scores.device)
    if not bool(mask.any()):
        raise CreditError(
            f"mask: expected at least one valid token, got none (shape {tuple(mask.shape)})"
        )
    if not (0.0 < beta < math.inf):
        raise CreditError(f"beta: expected a finite value > 0, got {beta!r}")
    if not (0.0 <= lam <= 1.0):
        raise CreditError(f"lam: expected a value in [0, 1], got {lam!r}")
    if on_nonfinite not in get_args(NonFinitePolicy):
        raise CreditError(
            f"on_nonfinite: expected one of {list(get_args(NonFinitePolicy))}, got {on_nonfinite!r}"
        )


def allocate_weights(
    scores: torch.Tensor,
    mask: torch.Tensor,
    *,
    beta: float,
    lam: float,
    on_nonfinite: NonFinitePolicy,
    score_name: str = "scores",
) -> tuple[torch.Tensor, CreditDiagnostics]:
    """Token weights w (B, T) float64 from scores (B, T) over the valid tokens of ``mask``.

    s_hat = s / (rms(s) + 1e-8) over valid tokens; w = (1 - lam) + lam * n * softmax(beta s_hat).
    Invariants: mean of w over valid tokens is 1, w >= 0 (> 0 when lam < 1), w = 0 at padding,
    n = 1 or constant scores give w = 1. A response with a non-finite valid score raises
    ``CreditError`` (``on_nonfinite="error"``) or gets w = 1 (``"uniform"``, counted).
    Requires ``scores`` (B, T), ``mask`` bool (B, T) on the same device with at least one
    valid token, beta > 0 finite and lam in [0, 1]; anything else is a ``CreditError``
    naming the argument.
    """
    _check_allocation_args(scores, mask, beta, lam, on_nonfinite, score_name)
    s = scores.to(torch.float64)
    finite_rows = torch.where(mask, torch.isfinite(s), True).all(dim=1)
    fallbacks = int((~finite_rows).sum())
    if fallbacks and on_nonfinite == "error":
        rows = torch.nonzero(~finite_rows).flatten().tolist()
        raise CreditError(
            f"{score_name}: non-finite values in responses {rows} (on_nonfinite='error'; "
            "set on_nonfinite='uniform' to fall back to uniform weights for them)"
        )
    s = torch.where(mask & finite_rows.unsqueeze(1), s, 0.0)
    n = mask.sum(dim=1).to(torch.float64)
    rms = torch.sqrt((s * s).sum(dim=1) / n)
    s_hat = s / (rms + RMS_EPS).unsqueeze(1)
    logits = torch.where(mask, beta * s_hat, float("-inf"))
    soft = torch.softmax(logits, dim=1)
    weights = (1.0 - lam) + lam * n.unsqueeze(1) * soft
    weights = torch.where(mask, weights, 0.0)
    return weights, weight_diagnostics(weights, mask, fallbacks)
