"""The step's micro-batches as one batch: action columns left-aligned, zero-padded to the
widest micro-batch (what a strategy that sees the whole step gets: ``apply_step_credit``, and
the credit under a critic, ``backends.openrlhf.critic``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from credit_core import CreditError, CreditSignals
from credit_core.batch import TOKEN_SIGNALS


def padded(values: torch.Tensor, width: int) -> torch.Tensor:
    """(n, A) ``values`` with zero columns appended up to ``width`` >= A."""
    return torch.nn.functional.pad(values, (0, width - values.shape[1]))


def stacked_signals(credits: Sequence[CreditSignals], width: int) -> CreditSignals:
    """The per-token signals of the micro-batches' ``credits`` (n_k, A_k), stacked along the
    batch and zero-padded to ``width`` columns. A signal present in some micro-batches only
    is a ``CreditError`` naming it."""
    stacked: dict[str, Any] = {}  # TOKEN_SIGNALS names: (n, width) tensors
    for name in TOKEN_SIGNALS:
        values = [getattr(credit, name) for credit in credits]
        present = [value for value in values if value is not None]
        if not present:
            continue
        if len(present) != len(values):
            lacking = [k for k, value in enumerate(values) if value is None]
            raise CreditError(
                f"credit signals: {name!r} is missing from micro-batches {lacking} of the step"
            )
        stacked[name] = torch.cat([padded(value, width) for value in present])
    return CreditSignals(**stacked)  # every per-token signal, none dropped
