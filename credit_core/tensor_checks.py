"""Shape/dtype/device checks shared by the batch containers; every failure is a CreditError."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from credit_core.errors import CreditError


def check_tensor(
    name: str,
    value: object,
    shape: Sequence[int | None],
    *,
    dtype: torch.dtype | None = None,
    floating: bool = False,
    device: torch.device | None = None,
) -> torch.Tensor:
    """Check that ``value`` is a tensor of ``shape`` (None = any size) and return it.

    Raises CreditError naming ``name``, the expected and the actual shape/dtype/device.
    """
    if not isinstance(value, torch.Tensor):
        raise CreditError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")
    expected = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
    if value.dim() != len(shape) or any(
        s is not None and s != actual for s, actual in zip(shape, value.shape, strict=False)
    ):
        raise CreditError(f"{name}: expected shape {expected}, got {tuple(value.shape)}")
    if dtype is not None and value.dtype != dtype:
        raise CreditError(f"{name}: expected dtype {dtype}, got {value.dtype}")
    if floating and not value.is_floating_point():
        raise CreditError(f"{name}: expected a floating-point tensor, got {value.dtype}")
    if device is not None and value.device != device:
        raise CreditError(f"{name}: expected device {device}, got {value.device}")
    return value
