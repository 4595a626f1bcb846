"""A one-process gloo group in the test process, and the trainer run inside it (not a test
module): FSDP2 wraps, DCP and the collectives then take their multi-rank code paths."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
import torch.distributed as dist

from backends.torch.distributed import DistContext


@contextmanager
def one_rank_group() -> Iterator[None]:
    """A gloo process group of world size 1 for the duration (destroyed after, unless the
    code under test already did)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def join_one_rank_group(monkeypatch: pytest.MonkeyPatch, *, strict_device: bool = False) -> None:
    """Make ``GRPORecipe`` join a one-process gloo group (its ``close`` destroys it) with the
    ``DistContext`` it would get from a one-rank ``torchrun``."""

    def init(cfg: object, device: str = "auto") -> DistContext:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        return DistContext(0, 1, 0, torch.device("cpu"), "gloo", strict_device=strict_device)

    monkeypatch.setattr("backends.torch.trainer.init_distributed", init)
