"""Pure-PyTorch versions of ``flash_attn.bert_padding``'s (un)padding helpers.

Same signatures and return values as flash-attn 2.7: tensors are (batch, seqlen, ...) with
a (batch, seqlen) 0/1 attention mask; "unpadded" tensors are (total_tokens, ...).
"""

from __future__ import annotations

import torch
from einops import rearrange
from torch.nn.functional import pad

__all__ = ["index_first_axis", "pad_input", "rearrange", "unpad_input"]


def index_first_axis(values: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Rows ``indices`` of ``values`` along its first axis."""
    return values[indices]


def unpad_input(
    hidden_states: torch.Tensor,
    attention_mask: torch.Tensor,
    unused_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor]:
    """(tokens, indices, cu_seqlens, max_seqlen, seqlens) of the real tokens of a padded batch.

    ``unused_mask`` marks tokens that are kept but not counted as used (flash-attn's meaning).
    """
    keep = attention_mask if unused_mask is None else attention_mask + unused_mask
    seqlens = keep.sum(dim=-1, dtype=torch.int32)
    used = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(keep.flatten()).flatten()
    cu_seqlens = pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    tokens = index_first_axis(rearrange(hidden_states, "b s ... -> (b s) ..."), indices)
    return tokens, indices, cu_seqlens, int(seqlens.max()), used


def pad_input(
    hidden_states: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int
) -> torch.Tensor:
    """Inverse of ``unpad_input``: scatter (total_tokens, ...) back to (batch, seqlen, ...)."""
    out = hidden_states.new_zeros((batch * seqlen, *hidden_states.shape[1:]))
    out[indices] = hidden_states
    return rearrange(out, "(b s) ... -> b s ...", b=batch)
