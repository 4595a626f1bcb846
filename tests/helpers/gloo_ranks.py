"""Several CPU processes in one gloo group for a test, with a deadline (not a test module).

``run_ranks(fn, args)`` spawns ``fn(rank, world, init_file, *args)`` in ``world`` processes
(``torch.multiprocessing``, spawn) and waits at most ``timeout`` seconds: a hang (processes
entering different collectives) fails the test instead of stalling ``make test``; an error
in a process fails it with that process's traceback. ``init_group`` is what ``fn`` calls
first: a gloo group whose collectives give up after ``collective_timeout`` seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp


def init_group(rank: int, world: int, init_file: str, collective_timeout: float = 20.0) -> None:
    """Join the gloo group of ``world`` processes rendezvousing at ``init_file``."""
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=collective_timeout),
    )


def run_ranks(
    fn: Callable[..., None],
    tmp_path: Path,
    args: tuple[Any, ...] = (),
    *,
    world: int = 2,
    timeout: float = 60.0,
) -> None:
    """Run ``fn(rank, world, init_file, *args)`` on ``world`` spawned processes; fail the
    test when one raises or when they are not all done within ``timeout`` seconds."""
    context = mp.start_processes(
        fn,
        args=(world, str(tmp_path / "gloo_init"), *args),
        nprocs=world,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + timeout
    while not context.join(timeout=max(0.1, deadline - time.monotonic())):
        if time.monotonic() >= deadline:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
            pytest.fail(f"{world} gloo processes still running after {timeout} s: a hang")
