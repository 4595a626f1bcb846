"""The reductions ``fold_tiles`` streams over the vocabulary (docs/design.md): each keeps
its running sums per row block, rescaled with the online softmax, and writes its outputs,
flat over the N = B x T rows, in the accumulation dtype ``acc``.

- ``SampledToken``: the sampled token's logit z_y; p_y and log p_y.
- ``EmbeddingMoments``: q = sum p^2, m1 = p^T E, m2 = (p^2)^T E (``PolicyStats``).
- ``UnsignedWork``: DATC's W0 given the reward gradient g, contracting g first.
- ``Entropy``: H = -sum p log p.
"""

from __future__ import annotations

import torch

from credit_core.logits_tiles import RowSoftmax, Tile, TileReduction


class TableChunks:
    """Row chunks E[v0:v1] of a table E (V, d) in ``acc``; a chunk is cast into one buffer of
    ``chunk`` x d elements, reused, when E is not in ``acc``."""

    def __init__(self, table: torch.Tensor, acc: torch.dtype, chunk: int) -> None:
        self.table = table
        cast = table.dtype != acc
        self.buf = (
            torch.empty(chunk * table.shape[1], dtype=acc, device=table.device) if cast else None
        )

    def __call__(self, v0: int, v1: int) -> torch.Tensor:
        rows = self.table[v0:v1]
        if self.buf is None:
            return rows
        return self.buf[: rows.numel()].view(rows.shape).copy_(rows)


class SampledToken(TileReduction):
    """z_y, the logit of the sampled token y per row, read from the tile that holds y.
    Writes ``prob`` p_y (N,) and ``logprob`` log p_y (N,) where asked for."""

    def __init__(
        self, ids: torch.Tensor, acc: torch.dtype, *, prob: bool = False, logprob: bool = False
    ) -> None:
        """ids (N,) int64 in [0, V)."""
        self.ids = ids
        n_rows, device = ids.shape[0], ids.device
        self.prob = torch.empty(n_rows, dtype=acc, device=device) if prob else None
        self.logprob = torch.empty(n_rows, dtype=acc, device=device) if logprob else None
        self.acc = acc

    def begin(self, rows: slice) -> None:
        self.y = self.ids[rows]
        self.z_y = torch.zeros(self.y.shape[0], dtype=self.acc, device=self.ids.device)

    def logits(self, tile: Tile) -> None:
        self.in_chunk = (self.y >= tile.v0) & (self.y < tile.v1)
        self.local = (self.y - tile.v0).clamp(0, tile.v1 - tile.v0 - 1).unsqueeze(1)
        self.z_y = self.pick(tile.z, self.z_y)

    def pick(self, values: torch.Tensor, picked: torch.Tensor) -> torch.Tensor:
        """``values`` (n, w) of the current tile at y where y is in it, else ``picked`` (n,)."""
        return torch.where(self.in_chunk, values.gather(1, self.local).squeeze(1), picked)

    def p_y(self, softmax: RowSoftmax) -> torch.Tensor:
        """p_y (n,) of the finished row block."""
        return torch.exp(self.z_y - softmax.run_max) * softmax.inv_sumexp()

    def finish(self, rows: slice, softmax: RowSoftmax) -> None:
        if self.prob is not None:
            self.prob[rows] = self.p_y(softmax)
        if self.logprob is not None:
            self.logprob[rows] = self.z_y - softmax.run_max - torch.log(softmax.sumexp)


class EmbeddingMoments(TileReduction):
    """Moments of E (V, d) under p: writes ``p_sq`` q (N,), ``m1`` p^T E and ``m2``
    (p^2)^T E (N, d). Per tile e^2 goes to the scratch half, and one matmul
    ``[e; e^2] @ E_chunk`` updates a (2 x rows, d) accumulator."""

    uses_scratch = True

    def __init__(self, table: torch.Tensor, acc: torch.dtype, n_rows: int, chunk: int) -> None:
        d, device = table.shape[1], table.device
        self.chunks = TableChunks(table, acc, chunk)
        self.p_sq = torch.empty(n_rows, dtype=acc, device=device)
        self.m1 = torch.empty(n_rows, d, dtype=acc, device=device)
        self.m2 = torch.empty(n_rows, d, dtype=acc, device=device)

    def begin(self, rows: slice) -> None:
        n = rows.stop - rows.start
        self.q = torch.zeros(n, dtype=self.m1.dtype, device=self.m1.device)
        self.acc = torch.zeros(2 * n, self.m1.shape[1], dtype=self.m1.dtype, device=self.m1.device)
        self.scales = torch.empty(2 * n, dtype=self.m1.dtype, device=self.m1.device)

    def fold(self, tile: Tile, softmax: RowSoftmax) -> None:
        n, e2 = tile.n, tile.scratch
        torch.mul(tile.z, tile.z, out=e2)
        self.scales[:n].copy_(softmax.scale)
        torch.mul(softmax.scale, softmax.scale, out=self.scales[n:])
        self.q.mul_(self.scales[n:]).add_(e2.sum(dim=1))
        self.acc.mul_(self.scales.unsqueeze(1)).addmm_(tile.both, self.chunks(tile.v0, tile.v1))

    def finish(self, rows: slice, softmax: RowSoftmax) -> None:
        n = rows.stop - rows.start
        inv_l = softmax.inv_sumexp()
        inv_l2 = inv_l * inv_l
        self.p_sq[rows] = self.q * inv_l2
        torch.mul(self.acc[:n], inv_l.unsqueeze(1), out=self.m1[rows])
        torch.mul(self.acc[n:], inv_l2.unsqueeze(1), out=self.m2[rows])


class UnsignedWork(TileReduction):
    """DATC's unsigned work W0 = p_y (u_y - ubar) - (S - ubar q) with u = g E^T, reading y
    and p_y from ``sampled`` (given before it). Writes ``work`` (N,). Per tile u goes to the
    scratch half (the second matmul), then e u, e^2 u and e^2 overwrite it in turn."""

    uses_scratch = True

    def __init__(
        self,
        sampled: SampledToken,
        table: torch.Tensor,
        grad: torch.Tensor,
        acc: torch.dtype,
        chunk: int,
    ) -> None:
        """table E (V, d); grad g (N, d)."""
        self.sampled = sampled
        self.chunks = TableChunks(table, acc, chunk)
        self.grad = grad
        self.work = torch.empty(grad.shape[0], dtype=acc, device=grad.device)

    def begin(self, rows: slice) -> None:
        acc, device = self.work.dtype, self.work.device
        self.g_rows = self.grad[rows].to(acc).contiguous()
        n = self.g_rows.shape[0]
        self.a1, self.a2, self.q, self.u_y = (
            torch.zeros(n, dtype=acc, device=device) for _ in range(4)
        )

    def logits(self, tile: Tile) -> None:
        torch.mm(self.g_rows, self.chunks(tile.v0, tile.v1).T, out=tile.scratch)
        self.u_y = self.sampled.pick(tile.scratch, self.u_y)

    def fold(self, tile: Tile, softmax: RowSoftmax) -> None:
        e, u = tile.z, tile.scratch
        s2 = softmax.scale * softmax.scale
        u.mul_(e)  # e u
        self.a1.mul_(softmax.scale).add_(u.sum(dim=1))
        u.mul_(e)  # e^2 u
        self.a2.mul_(s2).add_(u.sum(dim=1))
        torch.mul(e, e, out=u)  # e^2
        self.q.mul_(s2).add_(u.sum(dim=1))

    def finish(self, rows: slice, softmax: RowSoftmax) -> None:
        inv_l = softmax.inv_sumexp()
        inv_l2 = inv_l * inv_l
        ubar = self.a1 * inv_l
        S = self.a2 * inv_l2
        q = self.q * inv_l2
        self.work[rows] = self.sampled.p_y(softmax) * (self.u_y - ubar) - (S - ubar * q)


class Entropy(TileReduction):
    """H = -sum_v p_v log p_v per row; writes ``entropy`` (N,). Runs b = sum e log e: when
    the shift grows by D, e -> s e with s = exp(-D), so b -> s b + (s log s) l. At the end
    H = log l - b / l. Per tile e log e goes to the scratch half (0 where e = 0)."""

    uses_scratch = True

    def __init__(self, n_rows: int, acc: torch.dtype, device: torch.device) -> None:
        self.entropy = torch.empty(n_rows, dtype=acc, device=device)

    def begin(self, rows: slice) -> None:
        n = rows.stop - rows.start
        self.b = torch.zeros(n, dtype=self.entropy.dtype, device=self.entropy.device)

    def fold(self, tile: Tile, softmax: RowSoftmax) -> None:
        s = softmax.scale
        torch.xlogy(tile.z, tile.z, out=tile.scratch)
        self.b.mul_(s).add_(torch.xlogy(s, s) * softmax.sumexp).add_(tile.scratch.sum(dim=1))

    def finish(self, rows: slice, softmax: RowSoftmax) -> None:
        self.entropy[rows] = torch.log(softmax.sumexp) - self.b * softmax.inv_sumexp()
