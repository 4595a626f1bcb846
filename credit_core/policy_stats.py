"""Streamed reductions of the policy's softmax over the vocabulary (``PolicyStats``).

The logits are produced one (rows x vocabulary-chunk) tile at a time and folded into an
online (running-max) softmax, so no (B, T, V) tensor is ever materialized. Per tile:

    e  = exp(z - m)          running sum l += sum e,   acc1 += e @ E_chunk
    e2 = e * e               running q   += sum e2,    acc2 += e2 @ E_chunk

and when the running max m grows to m', every accumulator is rescaled by exp(m - m')
(or its square for the squared terms). At the end p = e / l, so m1 = acc1 / l,
m2 = acc2 / l^2, q = q / l^2. Accumulation is float32 for float32/bf16/fp16 inputs and
float64 when the reward embedding is float64 (as used by the exactness tests).

One fused pass per tile: the logits are written into a buffer allocated once per call, e
overwrites them in place, e2 is written below e, and a single matmul ``[e; e2] @ E_chunk``
updates both accumulators (stacked as one (2 x rows, d) tensor). Tile sizes were chosen by
measurement (``python -m benchmarks signals``, docs/performance.md).

The statistics are constants of the credit assignment: both functions compute under
``torch.no_grad()`` (inputs may require grad; outputs never do). Each tile's row maxima,
computed anyway, are checked (a flag per tile, read once per row block): a NaN or +inf
logit (e.g. a float16 matmul overflowing past 65504) raises ``CreditError`` naming the
first such tile, instead of NaN statistics downstream.
"""

from __future__ import annotations

import torch

from credit_core.batch import PolicyStats
from credit_core.errors import CreditError
from credit_core.logits_tiles import (
    LogitsTile,
    lm_head_tiles,
    logits_tiles,
    non_finite_tile_error,
)
from credit_core.tensor_checks import (
    check_lm_head,
    check_streaming,
    check_tensor,
    check_token_ids,
)

#: Vocabulary entries per logits tile, and the upper bound on a tile's elements (rows x
#: chunk): 2 Mi float32 = 8 MiB, and ``policy_stats`` holds two (e and e^2). Chosen by
#: measurement (``python -m benchmarks tiles``, docs/performance.md): at B x T = 4 x 1024,
#: V = 32k on 2 CPU threads, every setting from 2048 to 8192 wide and 1 to 8 Mi elements is
#: within noise (2.2-2.4x the LM-head matmul) at H = d = 896, where the matmuls dominate;
#: at H = d = 64, where the softmax dominates, 2 Mi tiles of 2048-4096 entries are fastest
#: (1.5x against 1.75x for 4 Mi tiles), and 16384-wide chunks are slower at both widths.
DEFAULT_CHUNK_SIZE = 4096
DEFAULT_TILE_ELEMENTS = 1 << 21


def _check_common(
    token_ids: torch.Tensor,
    reward_embedding: torch.Tensor,
    vocab: int,
    leading: tuple[int, int],
    device: torch.device,
    temperature: float,
    chunk_size: int,
) -> None:
    check_token_ids(token_ids, leading, vocab, device)
    check_tensor("reward_embedding", reward_embedding, (vocab, None), floating=True, device=device)
    check_streaming(temperature, chunk_size)


def _stream(
    tile: LogitsTile,
    token_ids: torch.Tensor,
    reward_embedding: torch.Tensor,
    vocab: int,
    chunk_size: int,
    tile_elements: int,
    source: str = "logits",
    dtype: torch.dtype = torch.float32,
) -> PolicyStats:
    """Fold logits tiles into PolicyStats; ``tile(rows, v0, v1, out)`` writes the logits of
    ``rows`` x [v0, v1) into ``out`` (n_rows, v1 - v0), a contiguous accumulation-dtype view.
    ``source`` names the logits and ``dtype`` the dtype they are computed in, for the error
    raised when a tile holds a NaN or +inf logit.

    Working memory: one buffer of 2 x rows x chunk accumulation-dtype elements (the tile's
    ``e`` stacked on ``e^2``, so one matmul with E_chunk serves m1 and m2), reused for every
    tile; the (2 x rows, d) accumulator; the outputs.
    """
    if not isinstance(tile_elements, int) or tile_elements < 1:
        raise CreditError(f"tile_elements: expected an integer >= 1, got {tile_elements!r}")
    B, T = token_ids.shape
    N = B * T
    d = reward_embedding.shape[1]
    device = token_ids.device
    ids = token_ids.reshape(N).long()
    chunk = min(chunk_size, vocab)
    row_block = min(max(1, tile_elements // chunk), max(1, N))
    acc_dtype = torch.promote_types(reward_embedding.dtype, torch.float32)
    cast_table = reward_embedding.dtype != acc_dtype

    def new(*shape: int) -> torch.Tensor:
        return torch.empty(shape, dtype=acc_dtype, device=device)

    p_sampled, p_sq, m1, m2 = new(N), new(N), new(N, d), new(N, d)
    buf = new(2 * row_block * chunk)
    table_buf = new(chunk * d) if cast_table else None
    for r0 in range(0, N, row_block):
        rows = slice(r0, min(N, r0 + row_block))
        y = ids[rows]
        n = y.shape[0]
        run_max = torch.full((n,), float("-inf"), dtype=acc_dtype, device=device)
        sums = torch.zeros(2 * n, dtype=acc_dtype, device=device)  # [sum e; sum e^2]
        acc = torch.zeros(2 * n, d, dtype=acc_dtype, device=device)  # [e @ E; e^2 @ E]
        scales = new(2 * n)
        z_y = torch.zeros(n, dtype=acc_dtype, device=device)
        # Per tile: does its row maximum hold a NaN or +inf (-inf is a masked entry)? Read
        # once per row block, so a GPU does not wait for the host at every tile.
        bad_tile = torch.zeros(-(-vocab // chunk), dtype=torch.bool, device=device)
        for v0 in range(0, vocab, chunk):
            v1 = min(vocab, v0 + chunk)
            w = v1 - v0
            both = buf[: 2 * n * w].view(2 * n, w)
            z, e2 = both[:n], both[n:]
            tile(rows, v0, v1, z)
            in_chunk = (y >= v0) & (y < v1)
            local = (y - v0).clamp(0, w - 1).unsqueeze(1)
            z_y = torch.where(in_chunk, z.gather(1, local).squeeze(1), z_y)
            tile_max = z.amax(dim=1)
            bad_tile[v0 // chunk] = ~(tile_max < float("inf")).all()
            new_max = torch.maximum(run_max, tile_max)
            # A row that has seen only -inf logits (masked entries) shifts by 0, not by -inf:
            # exp(-inf - (-inf)) would be nan. Its accumulators are still 0, so any scale works.
            shift = torch.where(new_max == float("-inf"), 0.0, new_max)
            torch.exp(run_max - shift, out=scales[:n])
            torch.mul(scales[:n], scales[:n], out=scales[n:])
            run_max = new_max
            e = z.sub_(shift.unsqueeze(1)).exp_()
            torch.mul(e, e, out=e2)
            table = reward_embedding[v0:v1]
            if table_buf is not None:
                table = table_buf[: w * d].view(w, d).copy_(table)
            sums.mul_(scales).add_(both.sum(dim=1))
            acc.mul_(scales.unsqueeze(1)).addmm_(both, table)
        if bool(bad_tile.any()):
            v0 = int(bad_tile.nonzero()[0]) * chunk
            v1 = min(vocab, v0 + chunk)
            z = buf[: n * (v1 - v0)].view(n, v1 - v0)
            tile(rows, v0, v1, z)
            raise non_finite_tile_error(z, rows, v0, v1, source, dtype)
        inv_l = 1.0 / sums[:n]
        inv_l2 = inv_l * inv_l
        p_sampled[rows] = torch.exp(z_y - run_max) * inv_l
        p_sq[rows] = sums[n:] * inv_l2
        torch.mul(acc[:n], inv_l.unsqueeze(1), out=m1[rows])
        torch.mul(acc[n:], inv_l2.unsqueeze(1), out=m2[rows])
    emb = reward_embedding[ids].to(acc_dtype)
    return PolicyStats(
        p_sampled=p_sampled.reshape(B, T),
        p_sq=p_sq.reshape(B, T),
        m1=m1.reshape(B, T, d),
        m2=m2.reshape(B, T, d),
        sampled_emb=emb.reshape(B, T, d),
    )


def policy_stats(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    token_ids: torch.Tensor,
    reward_embedding: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    lm_head_bias: torch.Tensor | None = None,
    tile_elements: int = DEFAULT_TILE_ELEMENTS,
) -> PolicyStats:
    """``PolicyStats`` from final hidden states, streaming the LM head over the vocabulary.

    - hidden (B, T, H): hidden states at the positions that predict ``token_ids``.
    - lm_head_weight (V, H), lm_head_bias (V,) or None: logits = hidden @ W.T + bias.
    - token_ids (B, T) integer in [0, V): the sampled tokens.
    - reward_embedding (V, d): E, the reward model's input embeddings in policy vocabulary.
    - temperature: the sampling temperature; p = softmax(logits / temperature).
    - chunk_size: vocabulary entries per tile; ``tile_elements`` caps rows x chunk: a tile
      is min(chunk_size, V) x max(1, tile_elements // chunk) logits, and the working memory
      is two such tiles (e and e^2) plus a (2 x rows, d) accumulator, besides the outputs.

    The matmul runs in the inputs' dtype (bf16 allowed), everything after it in float32
    (float64 if ``reward_embedding`` is float64). Output fields have that accumulation dtype.
    Computed under ``torch.no_grad()``: the inputs may require grad, the outputs do not.
    Raises ``CreditError`` naming the tile when a logit is NaN or +inf (a float16 matmul
    overflows above 65504: use float32 or bfloat16).
    """
    h, W = check_lm_head(hidden, lm_head_weight, lm_head_bias)
    B, T, H = h.shape
    V = W.shape[0]
    _check_common(token_ids, reward_embedding, V, (B, T), h.device, temperature, chunk_size)
    acc = torch.promote_types(reward_embedding.dtype, torch.float32)
    tile = lm_head_tiles(h.reshape(B * T, H), W, lm_head_bias, temperature, acc)
    with torch.no_grad():
        return _stream(
            tile,
            token_ids,
            reward_embedding,
            V,
            chunk_size,
            tile_elements,
            source="logits (hidden @ lm_head_weight.T)",
            dtype=h.dtype,
        )


def policy_stats_from_logits(
    logits: torch.Tensor,
    token_ids: torch.Tensor,
    reward_embedding: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    tile_elements: int = DEFAULT_TILE_ELEMENTS,
) -> PolicyStats:
    """``PolicyStats`` from materialized logits (B, T, V); same contract as ``policy_stats``
    (no-grad; ``CreditError`` naming the tile of a NaN or +inf logit)."""
    z_all = check_tensor("logits", logits, (None, None, None), floating=True)
    B, T, V = z_all.shape
    _check_common(token_ids, reward_embedding, V, (B, T), z_all.device, temperature, chunk_size)
    tile = logits_tiles(z_all.reshape(B * T, V), temperature)
    with torch.no_grad():
        return _stream(
            tile, token_ids, reward_embedding, V, chunk_size, tile_elements, dtype=z_all.dtype
        )
