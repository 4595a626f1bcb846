"""Batch-wide selection of a top fraction of tokens (docs/design.md, "Baselines").

``batch_quantile`` is ``torch.quantile``'s linear interpolation over the values of every
process of the step (``CreditBatch.gather``), computed by one sort so it has no size limit;
``top_fraction`` keeps the valid tokens whose value reaches the (1 - rho) quantile, ties
kept, as the 80/20-rule paper defines the selection and TRL's ``get_high_entropy_mask``
computes it.
"""

from __future__ import annotations

import torch

from credit_core.batch import CreditBatch
from credit_core.errors import CreditError
from credit_core.tensor_checks import check_finite_at


def batch_quantile(values: torch.Tensor, q: float) -> torch.Tensor:
    """The q-quantile (0-d, ``values``' dtype) of a 1-D tensor of n >= 1 values with linear
    interpolation between the order statistics at floor and ceil of q (n - 1), as
    ``torch.quantile(values, q)`` (which refuses more than 2^24 values)."""
    if values.dim() != 1 or values.numel() == 0:
        raise CreditError(
            f"batch_quantile: expected a non-empty 1-D tensor, got shape {tuple(values.shape)}"
        )
    if not 0.0 <= q <= 1.0:
        raise CreditError(f"batch_quantile: expected q in [0, 1], got {q!r}")
    ordered = torch.sort(values).values
    pos = q * (values.numel() - 1)
    lo = int(pos)
    hi = min(lo + 1, values.numel() - 1)
    return torch.lerp(ordered[lo], ordered[hi], pos - lo)


def top_fraction(values: torch.Tensor, batch: CreditBatch, rho: float, name: str) -> torch.Tensor:
    """M (B, T) bool: the valid tokens of ``batch`` whose ``values`` (B, T) reach tau, the
    (1 - ``rho``) quantile of the values at the valid tokens of the whole step (every
    process, through ``batch.gather``). Ties at tau are kept, so slightly more than a
    ``rho`` share can be selected. A non-finite value at a valid token is a ``CreditError``
    naming ``name`` and the rows."""
    mask = batch.mask
    check_finite_at(name, values, mask)
    local = values[mask].to(torch.promote_types(values.dtype, torch.float32))
    tau = batch_quantile(batch.gathered(local), 1.0 - rho)
    return mask & (values >= tau.to(values.dtype))
