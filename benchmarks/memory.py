"""Peak extra memory of one call: resident set size on CPU, allocator peak on CUDA.

A *workload* is a function ``(**kwargs) -> dict[str, Callable[[], object]]`` named
``"module:function"``: it builds the inputs once, and each callable is one call to measure
on them; a callable named ``NAME:warmup``, if present, runs before ``NAME`` is measured (a
small call that loads kernels and library buffers). "Extra" memory is the peak during the
call minus what was in use just before it (inputs included in both, so only the call's own
temporaries and outputs count).

- CPU: every workload runs in a fresh subprocess (``python -m benchmarks.memory SPEC``), so
  allocations of the benchmark process cannot hide or inflate a peak. For each call the
  child resets the kernel's peak-RSS counter (``/proc/self/clear_refs``, Linux), makes the
  call once and reports ``VmHWM - VmRSS(before)`` from ``/proc/self/status``. The child runs
  with glibc's mmap threshold fixed at 1 MiB (``MALLOC_MMAP_THRESHOLD_``): by default glibc
  raises it after the first large free and then keeps freed tile-sized blocks resident, so
  RSS would measure the allocator's cache (and the previous call's leftovers) instead of
  what the call holds.
- CUDA: in process, ``torch.cuda.max_memory_allocated() - memory_allocated()`` per call.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

Workload = Callable[..., dict[str, Callable[[], object]]]
_PROC = Path("/proc/self")


def rss_peak_supported() -> bool:
    """True where the peak-RSS counter can be reset (Linux with ``/proc/self/clear_refs``)."""
    return os.access(_PROC / "clear_refs", os.W_OK) and (_PROC / "status").is_file()


def _status_kib(field: str) -> int:
    for line in (_PROC / "status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field} line")


def _resolve(target: str) -> Workload:
    module, _, name = target.partition(":")
    if not name:
        raise ValueError(f"workload: expected 'module:function', got {target!r}")
    fn: Workload = getattr(importlib.import_module(module), name)
    return fn


def calibration_workload(mib: int) -> dict[str, Callable[[], object]]:
    """A known answer for the measurement itself: ``alloc`` holds ``mib`` MiB (touched),
    ``none`` allocates nothing worth counting."""
    return {
        "alloc": lambda: torch.ones(mib * 2**20 // 4),
        "none": lambda: None,
    }


def _measure_cpu_here(target: str, kwargs: dict[str, Any], names: list[str]) -> dict[str, int]:
    calls = _resolve(target)(**kwargs)
    torch.ones(64, 64) @ torch.ones(64, 64)  # start the thread pool outside the measurement
    peaks = {}
    for name in names:
        if f"{name}:warmup" in calls:
            calls[f"{name}:warmup"]()
        gc.collect()
        (_PROC / "clear_refs").write_text("5")  # reset VmHWM to the current VmRSS
        before = _status_kib("VmRSS")
        out = calls[name]()
        peaks[name] = (_status_kib("VmHWM") - before) * 1024
        del out
    return peaks


def peak_extra_bytes(
    target: str,
    kwargs: dict[str, Any],
    names: list[str],
    *,
    device: torch.device,
    timeout_s: float = 900.0,
) -> dict[str, int | None]:
    """Peak extra bytes of one call of each of ``names`` of workload ``target(**kwargs)``.

    Values are ``None`` on a CPU without a resettable peak-RSS counter (not Linux). Raises
    ``RuntimeError`` (with the child's stderr) when the measuring subprocess fails.
    """
    if device.type == "cuda":
        calls = _resolve(target)(**kwargs)
        peaks: dict[str, int | None] = {}
        for name in names:
            if f"{name}:warmup" in calls:
                calls[f"{name}:warmup"]()
            torch.cuda.synchronize(device)
            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
            out = calls[name]()
            torch.cuda.synchronize(device)
            peaks[name] = int(torch.cuda.max_memory_allocated(device) - before)
            del out
        return peaks
    if not rss_peak_supported():
        return dict.fromkeys(names)
    spec = json.dumps(
        {"target": target, "kwargs": kwargs, "names": names, "threads": torch.get_num_threads()}
    )
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.memory", spec],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        env={**os.environ, "MALLOC_MMAP_THRESHOLD_": str(2**20)},
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"memory measurement of {target}({kwargs}) failed with exit code "
            f"{proc.returncode}:\n{proc.stderr[-4000:]}"
        )
    peaks_json: dict[str, int] = json.loads(proc.stdout.strip().splitlines()[-1])
    return {name: int(peaks_json[name]) for name in names}


def _main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m benchmarks.memory '<json spec>'", file=sys.stderr)
        return 2
    spec = json.loads(argv[0])
    torch.set_num_threads(int(spec["threads"]))
    print(json.dumps(_measure_cpu_here(spec["target"], spec["kwargs"], spec["names"])))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
