"""The policy's per-token entropy H_t = -sum_v p_t[v] log p_t[v], p_t = softmax(logits_t /
temperature), streamed over the vocabulary (``fold_tiles`` with ``Entropy``): no (B, T, V)
tensor is formed. ``streamed_logprobs_and_entropy`` folds the sampled token's log-prob into
the same pass (the old policy's pass of a backend that needs both); ``token_entropy_from_logits``
reduces logits a backend has already materialized (OpenRLHF's actor forward)."""

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
from credit_core.tile_reductions import Entropy, SampledToken


def _entropy_pass(
    logits: TiledLogits,
    acc: torch.dtype,
    chunk_size: int,
    tile_elements: int,
    ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Fold ``logits`` (checked by the caller) into (log p_y (N,) or None, H (N,)) in
    ``acc``, no grad; ``ids`` (N,) int64 adds the sampled token's log-prob to the pass."""
    entropy = Entropy(logits.n_rows, acc, logits.device)
    sampled = None if ids is None else SampledToken(ids, acc, logprob=True)
    reductions = (entropy,) if sampled is None else (sampled, entropy)
    with torch.no_grad():
        fold_tiles(logits, reductions, chunk_size, tile_elements, acc)
    return (None if sampled is None else sampled.logprob), entropy.entropy


def token_entropy(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    *,
    temperature: float = 1.0,
    lm_head_bias: torch.Tensor | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    tile_elements: int = DEFAULT_TILE_ELEMENTS,
) -> torch.Tensor:
    """H (B, T), the entropy of softmax((hidden @ lm_head_weight.T + bias) / temperature).

    - hidden (B, T, H), lm_head_weight (V, H), lm_head_bias (V,) or None, temperature,
      chunk_size, tile_elements: as in ``credit_core.policy_stats``.
    - Returns float32 (float64 if ``hidden`` is float64), never differentiable; masked
      entries (-inf logits) contribute 0. The LM-head matmul runs in the inputs' dtype.
    - Memory: one (2 x rows x chunk) buffer (the tile and e log e) and O(rows) vectors.
    - Raises ``CreditError`` naming the tile when a logit is NaN or +inf.
    """
    h, W = check_lm_head(hidden, lm_head_weight, lm_head_bias)
    B, T, _ = h.shape
    check_streaming(temperature, chunk_size)
    check_tile_elements(tile_elements)
    acc = torch.promote_types(h.dtype, torch.float32)
    logits = lm_head_logits(h, W, lm_head_bias, temperature, acc)
    _, entropy = _entropy_pass(logits, acc, chunk_size, tile_elements)
    return entropy.reshape(B, T)


def token_entropy_from_logits(
    logits: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    tile_elements: int = DEFAULT_TILE_ELEMENTS,
) -> torch.Tensor:
    """H (B, T), the entropy of softmax(logits / temperature), from materialized logits
    (B, T, V) floating, streamed over the vocabulary in (rows x ``chunk_size``) tiles copied
    from them (no (B, T, V) temporary). Same contract as ``token_entropy``: float32
    (float64 for float64 logits), never differentiable, -inf logits contribute 0, a NaN or
    +inf logit is a ``CreditError`` naming its tile."""
    z_all = check_tensor("logits", logits, (None, None, None), floating=True)
    B, T, _ = z_all.shape
    check_streaming(temperature, chunk_size)
    check_tile_elements(tile_elements)
    acc = torch.promote_types(z_all.dtype, torch.float32)
    tiled = materialized_logits(z_all, temperature)
    _, entropy = _entropy_pass(tiled, acc, chunk_size, tile_elements)
    return entropy.reshape(B, T)


def streamed_logprobs_and_entropy(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    token_ids: torch.Tensor,
    *,
    temperature: float = 1.0,
    lm_head_bias: torch.Tensor | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    tile_elements: int = DEFAULT_TILE_ELEMENTS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p_y, H), both (B, T), from ONE streamed LM-head pass (``fold_tiles`` with
    ``SampledToken`` and ``Entropy``): the old policy's log-probs and its entropy for the
    price of the log-probs alone.

    token_ids (B, T) in [0, V); the other arguments and the dtype rules as
    ``token_entropy``. log p_y = log softmax(logits / temperature)[y], as
    ``adapters.logprobs.token_logprobs`` computes it but never differentiable.
    """
    h, W = check_lm_head(hidden, lm_head_weight, lm_head_bias)
    B, T, _ = h.shape
    ids = check_token_ids(token_ids, (B, T), W.shape[0], h.device).reshape(B * T).long()
    check_streaming(temperature, chunk_size)
    check_tile_elements(tile_elements)
    acc = torch.promote_types(h.dtype, torch.float32)
    logits = lm_head_logits(h, W, lm_head_bias, temperature, acc)
    logprob, entropy = _entropy_pass(logits, acc, chunk_size, tile_elements, ids)
    assert logprob is not None  # ids were given
    return logprob.reshape(B, T), entropy.reshape(B, T)
