"""``backends.torch.step``: what the phases of a step report (here: their timing)."""

from __future__ import annotations

import pytest
import torch

from backends.torch import step
from backends.torch.step import PhaseClock


class FakeGpu:
    """A host clock and a device queue: launched work runs asynchronously and only a
    ``synchronize`` makes the host wait for it."""

    def __init__(self) -> None:
        self.now = 0.0
        self.queued = 0.0
        self.synced: list[torch.device] = []

    def host(self, seconds: float) -> None:
        self.now += seconds

    def launch(self, seconds: float) -> None:
        self.queued += seconds

    def synchronize(self, device: torch.device) -> None:
        self.synced.append(device)
        self.now, self.queued = self.now + self.queued, 0.0


def test_a_phase_is_billed_the_gpu_work_it_launched(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu()
    monkeypatch.setattr(torch.cuda, "synchronize", gpu.synchronize)
    monkeypatch.setattr(step, "perf_counter", lambda: gpu.now)
    device = torch.device("cuda", 1)
    clock = PhaseClock(device)
    gpu.host(1.0)
    gpu.launch(5.0)  # e.g. the signals phase's kernels, still running when it returns
    first = clock.lap()
    gpu.host(2.0)
    second = clock.lap()
    assert (first, second) == (6.0, 2.0)
    assert gpu.synced == [device] * 3


def test_a_cpu_clock_never_touches_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(device: torch.device) -> None:
        raise AssertionError("synchronize on a CPU run")

    monkeypatch.setattr(torch.cuda, "synchronize", refuse)
    assert PhaseClock(torch.device("cpu")).lap() >= 0.0
