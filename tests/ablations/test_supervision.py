"""``credit-ablate`` with worker processes: a worker that dies, hangs or is signalled ends the
runner with the worker and its run named; finished runs are kept (a rerun continues)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ablations.supervision import (
    RunStoppedError,
    WorkerFailedError,
    last_progress,
    set_status,
    status_file,
    supervise,
)

#: A stand-in worker: says which run it is on, then does ``then`` (Python statements).
WORKER = """
import sys, time
from pathlib import Path
from ablations.supervision import set_status
set_status(Path(sys.argv[1]), int(sys.argv[2]), "run s/llama/datc/seed" + sys.argv[2])
{then}
"""


def workers(out: Path, *bodies: str) -> list[subprocess.Popen[bytes]]:
    return [
        subprocess.Popen([sys.executable, "-c", WORKER.format(then=body), str(out), str(i)])
        for i, body in enumerate(bodies)
    ]


def wait_for_status(out: Path, count: int) -> None:
    deadline = time.monotonic() + 60
    while len(list((out / ".workers").glob("*.json"))) < count:
        assert time.monotonic() < deadline
        time.sleep(0.05)


@pytest.mark.slow
def test_a_worker_that_dies_ends_the_runner_naming_it_and_its_run(tmp_path: Path) -> None:
    procs = workers(
        tmp_path,
        "time.sleep(120)",
        "import os, signal; time.sleep(0.5); os.kill(os.getpid(), signal.SIGKILL)",
    )
    start = time.monotonic()
    with pytest.raises(WorkerFailedError) as info:
        supervise(procs, tmp_path, timeout_s=600, phase="runs")
    assert time.monotonic() - start < 60  # not after the other worker's 120 s
    message = str(info.value)
    assert "worker 1 ended (killed by SIGKILL) during run s/llama/datc/seed1" in message
    assert "run the same command to continue" in message
    assert all(p.poll() is not None for p in procs)  # the other worker was stopped


@pytest.mark.slow
def test_a_failed_run_is_named_with_its_exit_status(tmp_path: Path) -> None:
    procs = workers(tmp_path, "sys.exit(0)", "raise RuntimeError('boom')")
    with pytest.raises(WorkerFailedError, match=r"worker 1 ended \(exit status 1\) during run"):
        supervise(procs, tmp_path, timeout_s=600, phase="runs")


@pytest.mark.slow
def test_a_hung_worker_is_killed_after_the_timeout_and_named(tmp_path: Path) -> None:
    procs = workers(tmp_path, "time.sleep(120)")
    wait_for_status(tmp_path, 1)
    with pytest.raises(WorkerFailedError) as info:
        supervise(procs, tmp_path, timeout_s=1.0, phase="runs")
    assert "worker 0 showed no progress for 1 s during run s/llama/datc/seed0" in str(info.value)
    assert procs[0].returncode == -signal.SIGKILL


@pytest.mark.slow
def test_progress_in_the_run_keeps_a_slow_worker_alive(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    body = (
        f"set_status(Path(sys.argv[1]), 0, 'run x', Path({str(metrics)!r}))\n"
        f"for _ in range(28):\n    Path({str(metrics)!r}).write_text('1'); time.sleep(0.25)"
    )
    procs = workers(tmp_path, body)
    wait_for_status(tmp_path, 1)
    # runs 7 s, longer than the timeout; progress every 0.25 s, 20x inside it, so a loaded
    # machine that stalls the worker for seconds still passes
    supervise(procs, tmp_path, timeout_s=5.0, phase="runs")


@pytest.mark.slow
def test_a_stop_signal_is_passed_to_every_worker(tmp_path: Path) -> None:
    """The runner forwards SIGTERM; workers end (here: at once) and it says what stopped."""
    before = signal.getsignal(signal.SIGTERM)
    procs = workers(tmp_path, "time.sleep(120)", "time.sleep(120)")
    wait_for_status(tmp_path, 2)
    timer = threading.Timer(0.3, lambda: signal.raise_signal(signal.SIGTERM))
    timer.start()
    with pytest.raises(RunStoppedError) as info:
        supervise(procs, tmp_path, timeout_s=600, phase="runs")
    timer.join()
    assert "SIGTERM received: the runs phase was stopped" in str(info.value)
    assert "run s/llama/datc/seed0" in str(info.value) and "seed1" in str(info.value)
    assert [p.returncode for p in procs] == [-signal.SIGTERM, -signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_status_caught_half_written_still_shows_progress_by_its_time(tmp_path: Path) -> None:
    """A long phase (assets under load: 30 minutes) must not read a worker whose status file
    is caught mid-write as one that never showed progress: that killed a healthy worker.
    The status is written whole (a rename), and a file that does not parse counts by its
    time."""
    set_status(tmp_path, 0, "assets of s/llama/seed 3")
    file = status_file(tmp_path, 0)
    assert last_progress(tmp_path, 0) == ("assets of s/llama/seed 3", file.stat().st_mtime)
    assert [p.name for p in file.parent.iterdir()] == [file.name]  # no temporary left
    file.write_text('{"task": "assets of', encoding="utf-8")  # as a reader mid-write saw it
    task, seen = last_progress(tmp_path, 0)
    assert seen == file.stat().st_mtime > 0 and "unreadable" in task
    assert last_progress(tmp_path, 1) == ("start-up", 0.0)  # no status yet
