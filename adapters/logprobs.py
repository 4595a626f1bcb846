"""Differentiable log-probabilities of chosen tokens, streamed over the vocabulary.

``token_logprobs(hidden, weight, token_ids, bias=..., temperature=...)`` returns
log softmax((hidden @ weight.T + bias) / temperature)[token_ids] without materializing the
(rows x V) logits: the forward pass keeps a running log-sum-exp over (row block x vocabulary
chunk) tiles; the backward pass recomputes each tile and accumulates

    dlogp_y / dz = onehot(y) - softmax(z)          (z = logits / temperature)
    grad_hidden  = (g * dlogp/dz) @ W / temperature
    grad_W       = (g * dlogp/dz)^T @ hidden / temperature,   grad_bias = column sums

so the memory held between forward and backward is the inputs plus one (N,) log-sum-exp, and
the largest live temporary is one tile (the same bound as ``credit_core.policy_stats``). This
is the "fused linear + cross-entropy" idea; the cost is one extra LM-head matmul in backward.

Arithmetic after each matmul is float32 (float64 when ``hidden`` is float64); gradients are
returned in the inputs' dtypes.
"""

from __future__ import annotations

from typing import Any

import torch

from credit_core.policy_stats import DEFAULT_CHUNK_SIZE, DEFAULT_TILE_ELEMENTS
from credit_core.tensor_checks import check_lm_head, check_streaming, check_token_ids


def _tiles(vocab: int, chunk_size: int, tile_elements: int) -> tuple[int, int]:
    chunk = min(chunk_size, vocab)
    return chunk, max(1, tile_elements // chunk)


class _StreamedTokenLogProb(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        ids: torch.Tensor,
        inv_temp: float,
        chunk_size: int,
        tile_elements: int,
    ) -> torch.Tensor:
        N = hidden.shape[0]
        V = weight.shape[0]
        acc = torch.promote_types(hidden.dtype, torch.float32)
        chunk, row_block = _tiles(V, chunk_size, tile_elements)
        lse = torch.empty(N, dtype=acc, device=hidden.device)
        z_y = torch.empty(N, dtype=acc, device=hidden.device)
        for r0 in range(0, N, row_block):
            rows = slice(r0, min(N, r0 + row_block))
            y = ids[rows]
            run_max = torch.full((y.shape[0],), float("-inf"), dtype=acc, device=hidden.device)
            run_sum = torch.zeros(y.shape[0], dtype=acc, device=hidden.device)
            zy = torch.zeros(y.shape[0], dtype=acc, device=hidden.device)
            for v0 in range(0, V, chunk):
                v1 = min(V, v0 + chunk)
                b_tile = None if bias is None else bias[v0:v1]
                z = _logits_tile(hidden[rows], weight[v0:v1], b_tile, inv_temp, acc)
                in_chunk = (y >= v0) & (y < v1)
                local = (y - v0).clamp(0, v1 - v0 - 1).unsqueeze(1)
                zy = torch.where(in_chunk, z.gather(1, local).squeeze(1), zy)
                new_max = torch.maximum(run_max, z.amax(dim=1))
                run_sum.mul_(torch.exp(run_max - new_max)).add_(
                    z.sub_(new_max.unsqueeze(1)).exp_().sum(dim=1)
                )
                run_max = new_max
            lse[rows] = run_max + run_sum.log()
            z_y[rows] = zy
        ctx.save_for_backward(hidden, weight, bias, ids, lse)
        ctx.config = (inv_temp, chunk_size, tile_elements)
        return z_y - lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, bias, ids, lse = ctx.saved_tensors
        inv_temp, chunk_size, tile_elements = ctx.config
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        N, V = hidden.shape[0], weight.shape[0]
        acc = lse.dtype
        chunk, row_block = _tiles(V, chunk_size, tile_elements)
        g = grad_out.to(acc)
        grad_h = torch.zeros(hidden.shape, dtype=acc, device=hidden.device) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        grad_b = (
            torch.zeros(V, dtype=acc, device=weight.device) if need_b and bias is not None else None
        )
        for r0 in range(0, N, row_block):
            rows = slice(r0, min(N, r0 + row_block))
            y, g_rows = ids[rows], g[rows]
            h_acc = hidden[rows].to(acc)
            for v0 in range(0, V, chunk):
                v1 = min(V, v0 + chunk)
                w_tile = weight[v0:v1].to(hidden.dtype)
                b_tile = None if bias is None else bias[v0:v1]
                z = _logits_tile(hidden[rows], w_tile, b_tile, inv_temp, acc)
                # dL/dz = g * (onehot(y) - p), times 1/temperature for dL/d(logits); the
                # one-hot part is added without a host sync (0 where y is outside the tile)
                gz = z.sub_(lse[rows].unsqueeze(1)).exp_().mul_(-g_rows.unsqueeze(1))
                in_chunk = (y >= v0) & (y < v1)
                local = (y - v0).clamp(0, v1 - v0 - 1).unsqueeze(1)
                gz.scatter_add_(1, local, torch.where(in_chunk, g_rows, 0.0).unsqueeze(1))
                gz.mul_(inv_temp)
                if grad_h is not None:
                    grad_h[rows].addmm_(gz, w_tile.to(acc))
                if grad_w is not None:
                    grad_w[v0:v1].addmm_(gz.T, h_acc)
                if grad_b is not None:
                    grad_b[v0:v1] += gz.sum(dim=0)
        return (
            None if grad_h is None else grad_h.to(hidden.dtype),
            None if grad_w is None else grad_w.to(weight.dtype),
            None if grad_b is None else grad_b.to(bias.dtype),
            None,
            None,
            None,
            None,
        )


def _logits_tile(
    hidden: torch.Tensor,
    w_tile: torch.Tensor,
    b_tile: torch.Tensor | None,
    inv_temp: float,
    acc: torch.dtype,
) -> torch.Tensor:
    """(hidden @ w_tile.T + b_tile) * inv_temp in ``acc``: one vocabulary tile's logits, the
    head's rows ``w_tile`` cast to ``hidden``'s dtype (only this tile, never the head)."""
    z = (hidden @ w_tile.to(hidden.dtype).T).to(acc)
    if b_tile is not None:
        z.add_(b_tile.to(acc))
    return z.mul_(inv_temp) if inv_temp != 1.0 else z


def token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    token_ids: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    tile_elements: int = DEFAULT_TILE_ELEMENTS,
) -> torch.Tensor:
    """log softmax((hidden @ weight.T + bias) / temperature) at ``token_ids``, streamed.

    - hidden (B, T, H) floating; weight (V, H); bias (V,) or None; token_ids (B, T) integer
      in [0, V).
    - Returns (B, T) in float32 (float64 if ``hidden`` is float64), differentiable w.r.t.
      ``hidden``, ``weight`` and ``bias`` (first order) under the caller's grad mode.
    - No (B, T, V) tensor is built: at most one tile of min(chunk_size, V) x
      max(1, tile_elements // chunk) logits is live at a time, forward and backward.
    """
    h, W = check_lm_head(hidden, weight, bias)
    B, T, H = h.shape
    V = W.shape[0]
    ids = check_token_ids(token_ids, (B, T), V, h.device).reshape(B * T).long()
    check_streaming(temperature, chunk_size)
    fn: Any = _StreamedTokenLogProb
    out: torch.Tensor = fn.apply(
        h.reshape(B * T, H), W, bias, ids, 1.0 / temperature, chunk_size, tile_elements
    )
    return out.reshape(B, T)
