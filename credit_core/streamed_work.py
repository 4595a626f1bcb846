"""DATC's unsigned work W0 (B, T) streamed over the vocabulary, contracting g first.

When the reward gradient g is known before the policy statistics are taken, DATC needs m1
and m2 only through ubar = m1 . g and S = m2 . g, so the (B, T, d) statistics are skipped
(docs/design.md, "Contracting g first"). Per (rows x vocabulary-chunk) tile:

    z  = logits tile                  (the LM-head matmul, as in ``policy_stats``)
    u  = g_rows @ E_chunk^T           (the second and last matmul; u[v] = E[v] . g)
    e  = exp(z - m)                   l  += sum e,    a1 += sum e u
    e2 = e * e                        q  += sum e2,   a2 += sum e2 u

with the online-softmax rescaling of ``policy_stats`` (exp(m - m') for l and a1, its square
for q and a2). At the end ubar = a1 / l, S = a2 / l^2, q = q / l^2, p_y = exp(z_y - m) / l,
u_y = u[y] (read from the tile that holds y), and

    W0 = p_y (u_y - ubar) - (S - ubar q)        (DATC's W = sign(A) W0)

The same pass gives log p_y = z_y - m - log l for free (``streamed_work_and_logprobs``), so
a caller that needs the old policy's log-probs without gradient runs the LM head once.

Chunking, tile-size defaults, dtype rules, validation and the memory bound are those of
``credit_core.policy_stats``: one (2 x rows x chunk) buffer (the tile's e stacked on u),
never a (B, T, V) tensor and no (B, T, d) tensor besides the caller's g.
"""

from __future__ import annotations

import torch

from credit_core.errors import CreditError
from credit_core.logits_tiles import (
    LogitsTile,
    lm_head_tiles,
    logits_tiles,
    non_finite_tile_error,
)
from credit_core.policy_stats import DEFAULT_CHUNK_SIZE, DEFAULT_TILE_ELEMENTS
from credit_core.tensor_checks import (
    check_lm_head,
    check_streaming,
    check_tensor,
    check_token_ids,
)


def work_dtype(reward_embedding: torch.Tensor, reward_grad: torch.Tensor) -> torch.dtype:
    """Accumulation dtype of W0: float32, or float64 if E or g is float64 (as ``token_work``
    on ``policy_stats``)."""
    return torch.promote_types(
        torch.promote_types(reward_embedding.dtype, reward_grad.dtype), torch.float32
    )


def check_work_inputs(
    token_ids: torch.Tensor,
    reward_embedding: torch.Tensor,
    reward_grad: torch.Tensor,
    vocab: int,
    leading: tuple[int, int],
    device: torch.device,
    temperature: float,
    chunk_size: int,
    tile_elements: int,
) -> None:
    """The checks of ``policy_stats`` plus g (B, T, d) floating with d = E's width."""
    check_token_ids(token_ids, leading, vocab, device)
    E = check_tensor(
        "reward_embedding", reward_embedding, (vocab, None), floating=True, device=device
    )
    check_tensor("reward_grad", reward_grad, (*leading, E.shape[1]), floating=True, device=device)
    check_streaming(temperature, chunk_size)
    if not isinstance(tile_elements, int) or tile_elements < 1:
        raise CreditError(f"tile_elements: expected an integer >= 1, got {tile_elements!r}")


def _stream_work(
    tile: LogitsTile,
    token_ids: torch.Tensor,
    reward_embedding: torch.Tensor,
    reward_grad: torch.Tensor,
    vocab: int,
    chunk_size: int,
    tile_elements: int,
    source: str = "logits",
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold logits tiles into W0 (B, T) and log p_y (B, T); ``tile(rows, v0, v1, out)``
    writes the logits of ``rows`` x [v0, v1) into ``out`` (n_rows, v1 - v0), a contiguous
    accumulation-dtype view. ``source`` and ``dtype`` name the logits in the ``CreditError``
    raised when a tile holds a NaN or +inf logit (as ``policy_stats``).

    Working memory: one buffer of 2 x rows x chunk elements (e stacked on u), a cast copy of
    one E chunk if E is not in the accumulation dtype, (rows, d) of g, and O(rows) vectors.
    """
    B, T = token_ids.shape
    N = B * T
    d = reward_embedding.shape[1]
    device = token_ids.device
    ids = token_ids.reshape(N).long()
    grad = reward_grad.reshape(N, d)
    chunk = min(chunk_size, vocab)
    row_block = min(max(1, tile_elements // chunk), max(1, N))
    acc = work_dtype(reward_embedding, reward_grad)
    cast_table = reward_embedding.dtype != acc

    def new(*shape: int) -> torch.Tensor:
        return torch.empty(shape, dtype=acc, device=device)

    work, logp = new(N), new(N)
    buf = new(2 * row_block * chunk)
    table_buf = new(chunk * d) if cast_table else None
    for r0 in range(0, N, row_block):
        rows = slice(r0, min(N, r0 + row_block))
        y = ids[rows]
        n = y.shape[0]
        g_rows = grad[rows].to(acc).contiguous()
        run_max = torch.full((n,), float("-inf"), dtype=acc, device=device)
        first = torch.zeros(2 * n, dtype=acc, device=device)  # [sum e; sum e u]
        second = torch.zeros(2 * n, dtype=acc, device=device)  # [sum e^2; sum e^2 u]
        scale = new(n)
        z_y = torch.zeros(n, dtype=acc, device=device)
        u_y = torch.zeros(n, dtype=acc, device=device)
        # NaN or +inf row maxima per tile, read once per row block (see policy_stats)
        bad_tile = torch.zeros(-(-vocab // chunk), dtype=torch.bool, device=device)
        for v0 in range(0, vocab, chunk):
            v1 = min(vocab, v0 + chunk)
            w = v1 - v0
            both = buf[: 2 * n * w].view(2 * n, w)
            z, u = both[:n], both[n:]
            tile(rows, v0, v1, z)
            table = reward_embedding[v0:v1]
            if table_buf is not None:
                table = table_buf[: w * d].view(w, d).copy_(table)
            torch.mm(g_rows, table.T, out=u)
            in_chunk = (y >= v0) & (y < v1)
            local = (y - v0).clamp(0, w - 1).unsqueeze(1)
            z_y = torch.where(in_chunk, z.gather(1, local).squeeze(1), z_y)
            u_y = torch.where(in_chunk, u.gather(1, local).squeeze(1), u_y)
            tile_max = z.amax(dim=1)
            bad_tile[v0 // chunk] = ~(tile_max < float("inf")).all()
            new_max = torch.maximum(run_max, tile_max)
            # A row that has seen only -inf logits shifts by 0 (see policy_stats).
            shift = torch.where(new_max == float("-inf"), 0.0, new_max)
            torch.exp(run_max - shift, out=scale)
            run_max = new_max
            e = z.sub_(shift.unsqueeze(1)).exp_()
            u.mul_(e)  # e u
            first.view(2, n).mul_(scale).add_(both.sum(dim=1).view(2, n))
            u.mul_(e)  # e^2 u
            e.mul_(e)  # e^2
            second.view(2, n).mul_(scale * scale).add_(both.sum(dim=1).view(2, n))
        if bool(bad_tile.any()):
            v0 = int(bad_tile.nonzero()[0]) * chunk
            v1 = min(vocab, v0 + chunk)
            z = buf[: n * (v1 - v0)].view(n, v1 - v0)
            tile(rows, v0, v1, z)
            raise non_finite_tile_error(z, rows, v0, v1, source, dtype)
        inv_l = 1.0 / first[:n]
        inv_l2 = inv_l * inv_l
        ubar = first[n:] * inv_l
        S = second[n:] * inv_l2
        q = second[:n] * inv_l2
        p_y = torch.exp(z_y - run_max) * inv_l
        work[rows] = p_y * (u_y - ubar) - (S - ubar * q)
        logp[rows] = z_y - run_max - torch.log(first[:n])
    return work.reshape(B, T), logp.reshape(B, T)


def streamed_work_and_logprobs(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    token_ids: torch.Tensor,
    reward_embedding: torch.Tensor,
    reward_grad: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    lm_head_bias: torch.Tensor | None = None,
    tile_elements: int = DEFAULT_TILE_ELEMENTS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(W0, log p_y), both (B, T) in the accumulation dtype, from one streamed pass; the
    contract of ``streamed_unsigned_work``. log p_y = log softmax(logits / temperature)[y]
    (as ``adapters.logprobs.token_logprobs``, but never differentiable)."""
    h, W = check_lm_head(hidden, lm_head_weight, lm_head_bias)
    B, T, H = h.shape
    V = W.shape[0]
    check_work_inputs(
        token_ids,
        reward_embedding,
        reward_grad,
        V,
        (B, T),
        h.device,
        temperature,
        chunk_size,
        tile_elements,
    )
    acc = work_dtype(reward_embedding, reward_grad)
    with torch.no_grad():
        tile = lm_head_tiles(h.reshape(B * T, H), W, lm_head_bias, temperature, acc)
        return _stream_work(
            tile,
            token_ids,
            reward_embedding,
            reward_grad,
            V,
            chunk_size,
            tile_elements,
            source="logits (hidden @ lm_head_weight.T)",
            dtype=h.dtype,
        )


def streamed_unsigned_work(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    token_ids: torch.Tensor,
    reward_embedding: torch.Tensor,
    reward_grad: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    lm_head_bias: torch.Tensor | None = None,
    tile_elements: int = DEFAULT_TILE_ELEMENTS,
) -> torch.Tensor:
    """W0 (B, T), DATC's work without sign(A), from final hidden states: two matmuls per tile.

    - hidden (B, T, H), lm_head_weight (V, H), lm_head_bias (V,) or None, token_ids (B, T)
      in [0, V), reward_embedding E (V, d), temperature, chunk_size, tile_elements: as in
      ``credit_core.policy_stats``.
    - reward_grad g (B, T, d) floating: dR/d(RM input embedding) at the policy positions.
    - Returns W0 = p_y (u_y - ubar) - (S - ubar q) (docs/design.md), float32 (float64 if E
      or g is float64), equal to ``token_work(policy_stats(...), g, None)`` up to rounding.
      W0 is exactly 0 wherever g_t = 0 (padding, by the reward-gradient contract) and is
      never differentiable. The LM-head matmul runs in the inputs' dtype (bf16 allowed);
      ``u = g E^T`` and everything after it in the accumulation dtype.
    - Memory: one (2 x rows x chunk) buffer; no (B, T, V) and no (B, T, d) tensor is made.
    """
    work, _ = streamed_work_and_logprobs(
        hidden,
        lm_head_weight,
        token_ids,
        reward_embedding,
        reward_grad,
        temperature=temperature,
        chunk_size=chunk_size,
        lm_head_bias=lm_head_bias,
        tile_elements=tile_elements,
    )
    return work


def streamed_unsigned_work_from_logits(
    logits: torch.Tensor,
    token_ids: torch.Tensor,
    reward_embedding: torch.Tensor,
    reward_grad: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    tile_elements: int = DEFAULT_TILE_ELEMENTS,
) -> torch.Tensor:
    """W0 (B, T) from materialized logits (B, T, V); one matmul (g E^T) per tile. Same
    contract as ``streamed_unsigned_work``."""
    z_all = check_tensor("logits", logits, (None, None, None), floating=True)
    B, T, V = z_all.shape
    check_work_inputs(
        token_ids,
        reward_embedding,
        reward_grad,
        V,
        (B, T),
        z_all.device,
        temperature,
        chunk_size,
        tile_elements,
    )
    with torch.no_grad():
        tile = logits_tiles(z_all.reshape(B * T, V), temperature)
        work, _ = _stream_work(
            tile,
            token_ids,
            reward_embedding,
            reward_grad,
            V,
            chunk_size,
            tile_elements,
            dtype=z_all.dtype,
        )
    return work
