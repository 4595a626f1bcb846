"""Logits tiles for the vocabulary-streamed kernels (``credit_core.policy_stats``,
``credit_core.streamed_work``): ``tile(rows, v0, v1, out)`` writes the temperature-scaled
logits of ``rows`` x [v0, v1) into ``out`` (the LM-head matmul in the inputs' dtype, then
bias and 1/temperature in the accumulation dtype); ``non_finite_tile_error`` names a tile
that holds a NaN or +inf logit.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from credit_core.errors import CreditError

#: ``tile(rows, v0, v1, out)``: write the logits of ``rows`` x [v0, v1) into ``out``
#: (n_rows, v1 - v0), a contiguous view in the accumulation dtype.
LogitsTile = Callable[[slice, int, int, torch.Tensor], None]


def lm_head_tiles(
    flat_hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    temperature: float,
    acc: torch.dtype,
) -> LogitsTile:
    """Tiles of (flat_hidden @ weight.T + bias) / temperature.

    flat_hidden (N, H); weight (V, H), each tile's rows cast to ``flat_hidden``'s dtype (no
    full-size copy of the head when the dtypes differ); bias (V,) or None. The matmul runs in
    the hidden states' dtype; when that is ``acc`` it writes straight into ``out`` (one
    ``addmm`` with the bias and the temperature folded in).
    """
    inv_temp = 1.0 / temperature

    def tile(rows: slice, v0: int, v1: int, out: torch.Tensor) -> None:
        h_rows, w_t = flat_hidden[rows], weight[v0:v1].to(flat_hidden.dtype).T
        if flat_hidden.dtype != acc:
            out.copy_(h_rows @ w_t)
            if bias is not None:
                out.add_(bias[v0:v1])
            if inv_temp != 1.0:
                out.mul_(inv_temp)
        elif bias is None:
            torch.mm(h_rows, w_t, out=out)
            if inv_temp != 1.0:
                out.mul_(inv_temp)
        else:
            b = bias[v0:v1].to(acc).unsqueeze(0)
            torch.addmm(b, h_rows, w_t, beta=inv_temp, alpha=inv_temp, out=out)

    return tile


def logits_tiles(flat_logits: torch.Tensor, temperature: float) -> LogitsTile:
    """Tiles copied from materialized logits (N, V), divided by ``temperature``."""
    inv_temp = 1.0 / temperature

    def tile(rows: slice, v0: int, v1: int, out: torch.Tensor) -> None:
        out.copy_(flat_logits[rows, v0:v1])
        if inv_temp != 1.0:
            out.mul_(inv_temp)

    return tile


def non_finite_tile_error(
    z: torch.Tensor, rows: slice, v0: int, v1: int, source: str, dtype: torch.dtype
) -> CreditError:
    """The error for a logits tile ``z`` holding a NaN or +inf (only built on failure);
    ``source`` names the logits, ``dtype`` the dtype they were computed in."""
    where = f"{source}: rows {rows.start}:{rows.stop} x vocabulary {v0}:{v1}"
    if dtype == torch.float16 and bool(torch.isposinf(z).any()):
        return CreditError(
            f"{where}: logits overflow float16 (largest finite value 65504); compute them "
            "in float32 or bfloat16 (e.g. pass hidden and the LM head weight as .float())"
        )
    kind = "+inf" if bool(torch.isposinf(z).any()) else "NaN"
    return CreditError(f"{where}: a logit is {kind}; expected finite logits (or -inf)")
