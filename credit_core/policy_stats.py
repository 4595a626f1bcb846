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
from credit_core.logits_tiles import TiledLogits, fold_tiles, lm_head_logits, materialized_logits
from credit_core.tensor_checks import (
    check_lm_head,
    check_streaming,
    check_tensor,
    check_tile_elements,
    check_token_ids,
)
from credit_core.tile_reductions import EmbeddingMoments, SampledToken

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
    tile_elements: int,
) -> None:
    check_token_ids(token_ids, leading, vocab, device)
    check_tensor("reward_embedding", reward_embedding, (vocab, None), floating=True, device=device)
    check_streaming(temperature, chunk_size)
    check_tile_elements(tile_elements)


def _stream(
    logits: TiledLogits,
    token_ids: torch.Tensor,
    reward_embedding: torch.Tensor,
    chunk_size: int,
    tile_elements: int,
) -> PolicyStats:
    """Fold ``logits`` into PolicyStats (``fold_tiles`` with ``SampledToken`` and
    ``EmbeddingMoments``). Working memory: one buffer of 2 x rows x chunk accumulation-dtype
    elements (e stacked on e^2), the (2 x rows, d) accumulator, the outputs.
    """
    B, T = token_ids.shape
    N = B * T
    d = reward_embedding.shape[1]
    ids = token_ids.reshape(N).long()
    acc = torch.promote_types(reward_embedding.dtype, torch.float32)
    sampled = SampledToken(ids, acc, prob=True)
    moments = EmbeddingMoments(reward_embedding, acc, N, min(chunk_size, logits.vocab))
    fold_tiles(logits, (sampled, moments), chunk_size, tile_elements, acc)
    assert sampled.prob is not None
    emb = reward_embedding[ids].to(acc)
    return PolicyStats(
        p_sampled=sampled.prob.reshape(B, T),
        p_sq=moments.p_sq.reshape(B, T),
        m1=moments.m1.reshape(B, T, d),
        m2=moments.m2.reshape(B, T, d),
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
    B, T, _ = h.shape
    _check_common(
        token_ids,
        reward_embedding,
        W.shape[0],
        (B, T),
        h.device,
        temperature,
        chunk_size,
        tile_elements,
    )
    acc = torch.promote_types(reward_embedding.dtype, torch.float32)
    logits = lm_head_logits(h, W, lm_head_bias, temperature, acc)
    with torch.no_grad():
        return _stream(logits, token_ids, reward_embedding, chunk_size, tile_elements)


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
    _check_common(
        token_ids, reward_embedding, V, (B, T), z_all.device, temperature, chunk_size, tile_elements
    )
    with torch.no_grad():
        return _stream(
            materialized_logits(z_all, temperature),
            token_ids,
            reward_embedding,
            chunk_size,
            tile_elements,
        )
