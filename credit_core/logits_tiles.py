"""The tile loop of the vocabulary-streamed kernels (``credit_core.policy_stats``,
``credit_core.streamed_work``, ``credit_core.token_entropy``).

``TiledLogits`` are the temperature-scaled logits of N rows x V, written one
(rows x [v0, v1)) tile at a time (``lm_head_logits``: the LM-head matmul in the inputs'
dtype, then bias and 1/temperature in the accumulation dtype; ``materialized_logits``:
copied). ``fold_tiles`` walks the tiles through one online softmax (``RowSoftmax``: running
max m, l = sum exp(z - m), rescaled by exp(m - m') when the max grows) and hands each tile
to the caller's ``TileReduction``s, which keep their own running sums and write their
outputs per row block. A tile holding a NaN or +inf logit raises ``non_finite_tile_error``
naming the first such tile.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from credit_core.errors import CreditError

#: ``tile(rows, v0, v1, out)``: write the logits of ``rows`` x [v0, v1) into ``out``
#: (n_rows, v1 - v0), a contiguous view in the accumulation dtype.
LogitsTile = Callable[[slice, int, int, torch.Tensor], None]


@dataclass(frozen=True)
class TiledLogits:
    """Logits of ``n_rows`` x ``vocab`` on ``device``, written by ``tile``; ``source`` names
    them and ``dtype`` is the dtype they are computed in (for ``non_finite_tile_error``)."""

    tile: LogitsTile
    n_rows: int
    vocab: int
    device: torch.device
    source: str
    dtype: torch.dtype


def lm_head_logits(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    temperature: float,
    acc: torch.dtype,
) -> TiledLogits:
    """(hidden @ weight.T + bias) / temperature over the B x T rows of ``hidden``.

    hidden (B, T, H); weight (V, H), each tile's rows cast to ``hidden``'s dtype (no
    full-size copy of the head when the dtypes differ); bias (V,) or None. The matmul runs in
    the hidden states' dtype; when that is ``acc`` it writes straight into ``out`` (one
    ``addmm`` with the bias and the temperature folded in).
    """
    B, T, H = hidden.shape
    flat_hidden = hidden.reshape(B * T, H)
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

    source = "logits (hidden @ lm_head_weight.T)"
    return TiledLogits(tile, B * T, weight.shape[0], hidden.device, source, hidden.dtype)


def materialized_logits(logits: torch.Tensor, temperature: float) -> TiledLogits:
    """Logits (B, T, V) over their B x T rows, divided by ``temperature``."""
    B, T, V = logits.shape
    flat_logits = logits.reshape(B * T, V)
    inv_temp = 1.0 / temperature

    def tile(rows: slice, v0: int, v1: int, out: torch.Tensor) -> None:
        out.copy_(flat_logits[rows, v0:v1])
        if inv_temp != 1.0:
            out.mul_(inv_temp)

    return TiledLogits(tile, B * T, V, logits.device, "logits", logits.dtype)


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


@dataclass(frozen=True)
class Tile:
    """One tile, rows x [v0, v1) with n rows: ``both`` (2n, v1 - v0) in the accumulation
    dtype, its top half ``z`` the logits before the exp and e = exp(z - shift) after it, its
    bottom half ``scratch`` free for the one reduction that declares ``uses_scratch``."""

    both: torch.Tensor
    n: int
    v0: int
    v1: int

    @property
    def z(self) -> torch.Tensor:
        return self.both[: self.n]

    @property
    def scratch(self) -> torch.Tensor:
        return self.both[self.n :]


class RowSoftmax:
    """The online softmax of one row block of n rows over the tiles folded so far, in the
    accumulation dtype: ``run_max`` (n,) the running max m of the logits, ``sumexp`` (n,)
    l = sum exp(z - shift) with shift = m (0 while m is -inf), ``scale`` (n,) exp(m - m')
    of the latest tile (the factor by which every running sum over e is rescaled)."""

    def __init__(self, n: int, acc: torch.dtype, device: torch.device) -> None:
        self.run_max = torch.full((n,), float("-inf"), dtype=acc, device=device)
        self.sumexp = torch.zeros(n, dtype=acc, device=device)
        self.scale = torch.empty(n, dtype=acc, device=device)

    def shift_to(self, z: torch.Tensor) -> torch.Tensor:
        """Take in the logits tile ``z`` (n, w): grow m, set ``scale``, overwrite ``z`` with
        e = exp(z - shift) in place. Returns whether its row maxima hold a NaN or +inf (a
        0-d bool tensor; -inf is a masked entry), left on the device."""
        tile_max = z.amax(dim=1)
        bad = ~(tile_max < float("inf")).all()
        new_max = torch.maximum(self.run_max, tile_max)
        # A row that has seen only -inf logits (masked entries) shifts by 0, not by -inf:
        # exp(-inf - (-inf)) would be nan. Its running sums are still 0, so any scale works.
        shift = torch.where(new_max == float("-inf"), 0.0, new_max)
        torch.exp(self.run_max - shift, out=self.scale)
        self.run_max = new_max
        z.sub_(shift.unsqueeze(1)).exp_()
        return bad

    def add(self, e: torch.Tensor) -> None:
        """l <- l * scale + the row sums of the tile e (n, w)."""
        self.sumexp.mul_(self.scale).add_(e.sum(dim=1))

    def inv_sumexp(self) -> torch.Tensor:
        """1 / l (n,)."""
        return 1.0 / self.sumexp


class TileReduction:
    """One streamed reduction over the vocabulary. Per row block ``fold_tiles`` calls
    ``begin(rows)``, then per tile ``logits(tile)`` (``tile.z`` holds the logits) and
    ``fold(tile, softmax)`` (``tile.z`` holds e, read-only; ``softmax.scale`` is this
    tile's rescale and ``softmax.sumexp`` still excludes it), then ``finish(rows, softmax)``
    once every tile is folded. Reductions run in the order given, so one may read another
    given before it."""

    #: Whether ``logits``/``fold`` write ``tile.scratch``; at most one reduction per pass.
    uses_scratch: ClassVar[bool] = False

    def begin(self, rows: slice) -> None:
        """Reset the running sums for the rows ``rows``."""

    def logits(self, tile: Tile) -> None:
        """Read the logits tile ``tile.z`` (n, w) before the exp."""

    def fold(self, tile: Tile, softmax: RowSoftmax) -> None:
        """Fold e = ``tile.z`` (n, w) into the running sums."""

    def finish(self, rows: slice, softmax: RowSoftmax) -> None:
        """Write the outputs of ``rows`` from the running sums and ``softmax``."""


def fold_tiles(
    logits: TiledLogits,
    reductions: Sequence[TileReduction],
    chunk_size: int,
    tile_elements: int,
    acc: torch.dtype,
) -> None:
    """Stream ``logits`` through ``reductions``, in the accumulation dtype ``acc``.

    Tiles are min(chunk_size, vocab) wide and max(1, tile_elements // chunk) rows high
    (``chunk_size`` and ``tile_elements`` integers >= 1, checked by the caller);
    vocabulary chunks are folded in increasing order. Working memory: one buffer of
    2 x rows x chunk ``acc`` elements (the tile and its scratch half), reused for every
    tile, besides what the reductions hold. Raises ``non_finite_tile_error`` for the first
    tile of a row block that holds a NaN or +inf logit.
    """
    if sum(r.uses_scratch for r in reductions) > 1:
        raise ValueError("fold_tiles: at most one reduction per pass may use the scratch tile")
    tile, n_rows, vocab, device = logits.tile, logits.n_rows, logits.vocab, logits.device
    chunk = min(chunk_size, vocab)
    row_block = min(max(1, tile_elements // chunk), max(1, n_rows))
    buf = torch.empty(2 * row_block * chunk, dtype=acc, device=device)
    for r0 in range(0, n_rows, row_block):
        rows = slice(r0, min(n_rows, r0 + row_block))
        n = rows.stop - r0
        softmax = RowSoftmax(n, acc, device)
        for r in reductions:
            r.begin(rows)
        # Per tile: does its row maximum hold a NaN or +inf? Read once per row block, so a
        # GPU does not wait for the host at every tile.
        bad_tile = torch.zeros(-(-vocab // chunk), dtype=torch.bool, device=device)
        for v0 in range(0, vocab, chunk):
            v1 = min(vocab, v0 + chunk)
            t = Tile(buf[: 2 * n * (v1 - v0)].view(2 * n, v1 - v0), n, v0, v1)
            tile(rows, v0, v1, t.z)
            for r in reductions:
                r.logits(t)
            bad_tile[v0 // chunk] = softmax.shift_to(t.z)
            for r in reductions:
                r.fold(t, softmax)
            softmax.add(t.z)
        if bool(bad_tile.any()):
            v0 = int(bad_tile.nonzero()[0]) * chunk
            v1 = min(vocab, v0 + chunk)
            z = buf[: n * (v1 - v0)].view(n, v1 - v0)
            tile(rows, v0, v1, z)
            raise non_finite_tile_error(z, rows, v0, v1, logits.source, logits.dtype)
        for r in reductions:
            r.finish(rows, softmax)
