"""allocate_weights: bad input is a CreditError naming the argument."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from credit_core import (
    CreditError,
    allocate_weights,
)

pytestmark = pytest.mark.usefixtures("single_torch_thread")

B, T = 2, 3


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"scores": torch.randn(1, T)}, r"mask: expected shape \(1, 3\), got \(2, 3\)"),
        ({"scores": torch.randn(B * T)}, r"scores: expected shape \(\*, \*\), got \(6,\)"),
        ({"mask": torch.ones(B, T)}, r"mask: expected dtype torch.bool, got torch.float32"),
        ({"mask": torch.zeros(B, T, dtype=torch.bool)}, r"mask: expected at least one valid token"),
        ({"beta": 0.0}, r"beta: expected a finite value > 0, got 0.0"),
        ({"beta": float("inf")}, r"beta: expected a finite value > 0, got inf"),
        ({"lam": 1.5}, r"lam: expected a value in \[0, 1\], got 1.5"),
        ({"lam": float("nan")}, r"lam: expected a value in \[0, 1\], got nan"),
        (
            {"on_nonfinite": "skip"},
            r"on_nonfinite: expected one of \['error', 'uniform'\], got 'skip'",
        ),
    ],
)
def test_allocate_weights_rejects(override: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {
        "scores": torch.randn(B, T),
        "mask": torch.ones(B, T, dtype=torch.bool),
        "beta": 1.0,
        "lam": 0.5,
        "on_nonfinite": "error",
    }
    args.update(override)
    with pytest.raises(CreditError, match=message):
        allocate_weights(**args)
