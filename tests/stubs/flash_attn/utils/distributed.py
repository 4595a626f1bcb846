"""Pure-PyTorch ``flash_attn.utils.distributed.all_gather`` (concatenate along dim 0)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def all_gather(tensor: torch.Tensor, process_group: dist.ProcessGroup | None) -> torch.Tensor:
    """Concatenation along dim 0 of ``tensor`` from every rank of ``process_group``."""
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(process_group))]
    dist.all_gather(parts, tensor.contiguous(), group=process_group)
    return torch.cat(parts, dim=0)
