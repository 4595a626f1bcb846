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


def check_lm_head(
    hidden: object, weight: object, bias: object | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Check final hidden states (B, T, H) and an LM head: ``weight`` (V, H), ``bias`` (V,)
    or None, all floating and on ``hidden``'s device; return (hidden, weight)."""
    h = check_tensor("hidden", hidden, (None, None, None), floating=True)
    W = check_tensor("lm_head_weight", weight, (None, h.shape[2]), floating=True, device=h.device)
    if bias is not None:
        check_tensor("lm_head_bias", bias, (W.shape[0],), floating=True, device=h.device)
    return h, W


def check_token_ids(
    token_ids: object, shape: Sequence[int | None], vocab: int, device: torch.device
) -> torch.Tensor:
    """Check integer token ids of ``shape`` on ``device`` with values in [0, ``vocab``)."""
    ids = check_tensor("token_ids", token_ids, shape, device=device)
    if ids.is_floating_point() or ids.dtype == torch.bool:
        raise CreditError(f"token_ids: expected an integer dtype, got {ids.dtype}")
    if ids.numel() > 0:
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= vocab:
            raise CreditError(
                f"token_ids: expected values in [0, {vocab}) (the vocabulary), got [{lo}, {hi}]"
            )
    return ids


def check_streaming(temperature: float, chunk_size: int) -> None:
    """Check the settings of a vocabulary-streamed kernel: a finite ``temperature`` > 0 and
    an integer ``chunk_size`` >= 1."""
    if not (temperature > 0 and temperature != float("inf")):
        raise CreditError(f"temperature: expected a finite value > 0, got {temperature!r}")
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise CreditError(f"chunk_size: expected an integer >= 1, got {chunk_size!r}")


def check_tile_elements(tile_elements: int) -> None:
    """The cap on a logits tile's rows x chunk: an integer >= 1."""
    if not isinstance(tile_elements, int) or tile_elements < 1:
        raise CreditError(f"tile_elements: expected an integer >= 1, got {tile_elements!r}")


def check_finite_at(
    name: str, values: torch.Tensor, mask: torch.Tensor, *, nonnegative: bool = False
) -> None:
    """Raise CreditError naming ``name`` and the rows where ``values`` (B, T) is not finite
    (or, with ``nonnegative``, is negative) at a True position of ``mask`` (B, T)."""
    bad = ~torch.isfinite(values)
    if nonnegative:
        bad |= values < 0
    bad &= mask
    if bool(bad.any()):
        rows = torch.nonzero(bad.any(dim=1)).flatten().tolist()
        wanted = "finite values >= 0" if nonnegative else "finite values"
        raise CreditError(f"{name}: expected {wanted} at valid tokens, rows {rows} are not")
