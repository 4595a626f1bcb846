"""DeepSpeed ZeRO-3 on CPU (not a test module): fake partitions in one process
(``FakeZero3``), and the real engine's start on gloo processes (``init_deepspeed_on_gloo``).

Outside its module's forward a ZeRO-3 parameter is an empty partition: shape ``[0]``, with
``ds_id`` and ``ds_status`` NOT_AVAILABLE; ``deepspeed.zero.GatheredParameters`` makes it
whole for a block. ``FakeZero3`` partitions chosen parameters that way and replaces
``GatheredParameters`` by a stub that restores them for the block (no process group).

``live_config`` stands for what a ZeRO-3 run of TRL/transformers' ``Trainer`` holds while it
builds its models: a live ``HfDeepSpeedConfig`` of stage 3 (``TrainingArguments`` keeps it,
transformers reads it through a weakref: ``is_deepspeed_zero3_enabled``), under which
``from_pretrained`` builds the model inside ``deepspeed.zero.Init`` and loads its weights
through ``GatheredParameters``. The fake ``zero.Init`` partitions every parameter created
inside it when it exits (as DeepSpeed does after each module's ``__init__``); transformers'
ZeRO-3 loading also asks ``torch.distributed`` for the rank, so a process group must exist
(``tests.helpers.one_rank.one_rank_group``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
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
        self._monkeypatch = monkeypatch
        monkeypatch.setattr(deepspeed.zero, "GatheredParameters", self._gathered)

    @contextmanager
    def live_config(self) -> Iterator[None]:
        """A live stage-3 ``HfDeepSpeedConfig`` and the fake ``deepspeed.zero.Init`` for the
        duration (the weakref unset after)."""
        import deepspeed
        from transformers.integrations import HfDeepSpeedConfig, unset_hf_deepspeed_config

        self._monkeypatch.setattr(deepspeed.zero, "Init", self._init)
        config = HfDeepSpeedConfig(
            {"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1}
        )
        try:
            yield
        finally:
            del config
            unset_hf_deepspeed_config()

    def _init(self, *args: Any, **kwargs: Any) -> AbstractContextManager[None]:
        return self._partitioning()

    @contextmanager
    def _partitioning(self) -> Iterator[None]:
        created: list[torch.nn.Parameter] = []
        register = torch.nn.Module.register_parameter

        def recording(module: torch.nn.Module, name: str, param: Any) -> None:
            register(module, name, param)
            if isinstance(param, torch.nn.Parameter):
                created.append(param)

        self._monkeypatch.setattr(torch.nn.Module, "register_parameter", recording)
        try:
            yield
        finally:
            self._monkeypatch.setattr(torch.nn.Module, "register_parameter", register)
        self.partition(*{id(p): p for p in created}.values())

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


def init_deepspeed_on_gloo() -> None:
    """Start DeepSpeed's communication on the gloo group this process has joined
    (``tests.helpers.gloo_ranks.init_group``), as real ZeRO runs do on a GPU, minus CUDA.

    ``torch.cuda.current_device`` answers ``"cpu"`` (DeepSpeed's engine asks it). DeepSpeed's
    CPU accelerator would also JIT-compile its shared-memory all-reduce op (C++, about 70 s
    of one core on a fresh checkout) when its backend starts; that op serves
    ``inference_all_reduce`` alone, which nothing under test calls (ZeRO-3's gathers and
    reductions go through ``torch.distributed``), and a GPU run never builds it, so it is
    marked unavailable and DeepSpeed takes the torch path it falls back to."""
    import deepspeed

    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")
