"""Fake DeepSpeed ZeRO-3 partitions on CPU (not a test module).

Outside its module's forward a ZeRO-3 parameter is an empty partition: shape ``[0]``, with
``ds_id`` and ``ds_status`` NOT_AVAILABLE; ``deepspeed.zero.GatheredParameters`` makes it
whole for a block. ``FakeZero3`` partitions chosen parameters that way and replaces
``GatheredParameters`` by a stub that restores them for the block (no process group).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch


class FakeZero3:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import deepspeed
        from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

        self.status = ZeroParamStatus
        self.whole: dict[int, torch.Tensor] = {}
        self.gathers = 0
        monkeypatch.setattr(deepspeed.zero, "GatheredParameters", self._gathered)

    def partition(self, *params: torch.nn.Parameter) -> None:
        """Leave ``params`` as ZeRO-3 does outside a forward (their data kept here)."""
        for p in params:
            self.whole[id(p)] = p.data
            p.ds_id = len(self.whole)  # type: ignore[attr-defined]
            self._release(p)

    def _release(self, p: torch.nn.Parameter) -> None:
        p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        p.ds_status = self.status.NOT_AVAILABLE  # type: ignore[attr-defined]

    @contextmanager
    def _gathered(
        self, params: list[torch.nn.Parameter], modifier_rank: Any = None
    ) -> Iterator[None]:
        self.gathers += 1
        for p in params:
            p.data = self.whole[id(p)]
            p.ds_status = self.status.AVAILABLE  # type: ignore[attr-defined]
        try:
            yield
        finally:
            for p in params:
                self._release(p)
