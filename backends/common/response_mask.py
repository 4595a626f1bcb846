"""The response mask of sampled token ids: valid up to and including the first EOS."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def response_mask_from_eos(response_ids: torch.Tensor, eos_ids: Sequence[int]) -> torch.Tensor:
    """(B, R) bool: True up to and including the first EOS of each row (all True if none)."""
    is_eos = torch.isin(response_ids, torch.tensor(list(eos_ids), device=response_ids.device))
    before = is_eos.long().cumsum(dim=1) - is_eos.long()
    return before == 0
