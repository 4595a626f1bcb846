"""W0 by the cheaper of the two kernels, chosen by shape.

- ``two_matmul`` (``credit_core.streamed_work``): LM head + u = g E^T per tile, then exp,
  three in-place products and two stacked row sums over the tile; no (B, T, d) statistics.
- ``stats`` (``policy_stats`` + ``token_work``): LM head + [e; e^2] @ E per tile (a matmul
  of twice the rows), then W0 from the (B, T, d) statistics.

Per vocabulary entry and row the two-matmul kernel saves d multiply-adds and pays about
three extra elementwise passes, so it wins when d is large and loses when d is small
(docs/design.md, docs/performance.md): the crossover is a reward-embedding width,
``TWO_MATMUL_MIN_EMBED_DIM``.
"""

from __future__ import annotations

from typing import Literal

import torch

from credit_core.errors import CreditError
from credit_core.policy_stats import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_TILE_ELEMENTS,
    policy_stats,
    policy_stats_from_logits,
)
from credit_core.streamed_work import (
    streamed_unsigned_work,
    streamed_unsigned_work_from_logits,
)
from credit_core.tensor_checks import check_tensor
from credit_core.work import token_work

WorkPath = Literal["two_matmul", "stats"]
WORK_PATHS: tuple[str, ...] = ("auto", "two_matmul", "stats")

#: Smallest reward-embedding width d at which the two-matmul kernel is used by ``auto``.
#: Measured on 2 quiet CPU threads (``scripts/bench_two_matmul.py``, 4 x 1024 rows, V = 32k;
#: docs/results/two_matmul/): ``policy_stats`` / two-matmul = 1.36 at H = d = 896, 1.31 at
#: 256, 1.27 at 128, 1.29 at 64, 1.24 at 32; at d = 16 it is 1.08 with H = 16 but 0.82 with
#: H = 64, so below d = 32 the ``policy_stats`` path stays.
TWO_MATMUL_MIN_EMBED_DIM = 32


def choose_work_path(embed_dim: int, path: str = "auto") -> WorkPath:
    """The kernel for reward-embedding width ``embed_dim``: ``path`` unless it is "auto",
    then "two_matmul" when ``embed_dim >= TWO_MATMUL_MIN_EMBED_DIM``, else "stats"."""
    if path == "two_matmul":
        return "two_matmul"
    if path == "stats":
        return "stats"
    if path != "auto":
        raise CreditError(f"path: expected one of {list(WORK_PATHS)}, got {path!r}")
    return "two_matmul" if embed_dim >= TWO_MATMUL_MIN_EMBED_DIM else "stats"


def unsigned_work(
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
    path: str = "auto",
) -> torch.Tensor:
    """W0 (B, T) from final hidden states by the kernel ``choose_work_path`` picks.

    Arguments and result as ``credit_core.streamed_unsigned_work``; both kernels give the
    same W0 up to float rounding (``stats`` validates g only through ``token_work``'s
    broadcasting, so it is checked here first).
    """
    kernel = choose_work_path(int(reward_embedding.shape[-1]), path)
    if kernel == "two_matmul":
        return streamed_unsigned_work(
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
    with torch.no_grad():
        stats = policy_stats(
            hidden,
            lm_head_weight,
            token_ids,
            reward_embedding,
            temperature=temperature,
            chunk_size=chunk_size,
            lm_head_bias=lm_head_bias,
            tile_elements=tile_elements,
        )
        return token_work(stats, _checked_grad(reward_grad, stats.m1), None)


def unsigned_work_from_logits(
    logits: torch.Tensor,
    token_ids: torch.Tensor,
    reward_embedding: torch.Tensor,
    reward_grad: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    tile_elements: int = DEFAULT_TILE_ELEMENTS,
    path: str = "auto",
) -> torch.Tensor:
    """W0 (B, T) from materialized logits (B, T, V) by the kernel ``choose_work_path`` picks
    (from logits the kernels cost one and two (rows x V) x (V x d) matmuls)."""
    kernel = choose_work_path(int(reward_embedding.shape[-1]), path)
    if kernel == "two_matmul":
        return streamed_unsigned_work_from_logits(
            logits,
            token_ids,
            reward_embedding,
            reward_grad,
            temperature=temperature,
            chunk_size=chunk_size,
            tile_elements=tile_elements,
        )
    with torch.no_grad():
        stats = policy_stats_from_logits(
            logits,
            token_ids,
            reward_embedding,
            temperature=temperature,
            chunk_size=chunk_size,
            tile_elements=tile_elements,
        )
        return token_work(stats, _checked_grad(reward_grad, stats.m1), None)


def _checked_grad(reward_grad: torch.Tensor, m1: torch.Tensor) -> torch.Tensor:
    """g, checked to be (B, T, d) like ``m1`` and on its device."""
    shape = tuple(m1.shape)
    return check_tensor("reward_grad", reward_grad, shape, floating=True, device=m1.device)
