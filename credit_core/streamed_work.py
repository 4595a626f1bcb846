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

from credit_core.logits_tiles import TiledLogits, fold_tiles, lm_head_logits, materialized_logits
from credit_core.policy_stats import DEFAULT_CHUNK_SIZE, DEFAULT_TILE_ELEMENTS
from credit_core.tensor_checks import (
    check_lm_head,
    check_streaming,
    check_tensor,
    check_tile_elements,
    check_token_ids,
)
from credit_core.tile_reductions import SampledToken, UnsignedWork


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
    check_tile_elements(tile_elements)


def _stream_work(
    logits: TiledLogits,
    token_ids: torch.Tensor,
    reward_embedding: torch.Tensor,
    reward_grad: torch.Tensor,
    chunk_size: int,
    tile_elements: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold ``logits`` into W0 (B, T) and log p_y (B, T) (``fold_tiles`` with
    ``SampledToken`` and ``UnsignedWork``). Working memory: one buffer of 2 x rows x chunk
    elements (e stacked on u), a cast copy of one E chunk if E is not in the accumulation
    dtype, (rows, d) of g, and O(rows) vectors.
    """
    B, T = token_ids.shape
    N = B * T
    acc = work_dtype(reward_embedding, reward_grad)
    sampled = SampledToken(token_ids.reshape(N).long(), acc, logprob=True)
    grad = reward_grad.reshape(N, reward_embedding.shape[1])
    work = UnsignedWork(sampled, reward_embedding, grad, acc, min(chunk_size, logits.vocab))
    fold_tiles(logits, (sampled, work), chunk_size, tile_elements, acc)
    assert sampled.logprob is not None
    return work.work.reshape(B, T), sampled.logprob.reshape(B, T)


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
    B, T, _ = h.shape
    check_work_inputs(
        token_ids,
        reward_embedding,
        reward_grad,
        W.shape[0],
        (B, T),
        h.device,
        temperature,
        chunk_size,
        tile_elements,
    )
    acc = work_dtype(reward_embedding, reward_grad)
    logits = lm_head_logits(h, W, lm_head_bias, temperature, acc)
    with torch.no_grad():
        return _stream_work(
            logits, token_ids, reward_embedding, reward_grad, chunk_size, tile_elements
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
    tiled = materialized_logits(z_all, temperature)
    with torch.no_grad():
        work, _ = _stream_work(
            tiled, token_ids, reward_embedding, reward_grad, chunk_size, tile_elements
        )
    return work
