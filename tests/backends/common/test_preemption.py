"""``PreemptionWatch``: the first stop signal is recorded, not obeyed; a second one (not a
duplicate of the first) or the grace period running out ends the process at once, with one
line. Each case runs in its own process, as a scheduler would signal it."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from backends.common.preemption import DUPLICATE_WINDOW_S, PreemptionWatch
from tests.helpers.paths import REPO

BODY = """
import os, signal, sys, time
from backends.common.preemption import PreemptionWatch
with PreemptionWatch("prog", grace_s={grace}) as watch:
    {actions}
    print("requested", watch.requested, flush=True)
"""


def watched(actions: str, grace: float | None = None) -> subprocess.CompletedProcess[str]:
    code = BODY.format(grace=grace, actions=actions)
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_the_first_signal_is_recorded_and_a_duplicate_is_ignored() -> None:
    done = watched(
        "os.kill(os.getpid(), signal.SIGUSR1); os.kill(os.getpid(), signal.SIGTERM); "
        "time.sleep(0.2)"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"requested {int(signal.SIGUSR1)}"
    assert done.stderr == ""


def test_a_second_signal_ends_the_process_at_once_with_one_line() -> None:
    start = time.monotonic()
    done = watched(
        "os.kill(os.getpid(), signal.SIGTERM); "
        f"time.sleep({DUPLICATE_WINDOW_S + 0.2}); "
        "os.kill(os.getpid(), signal.SIGTERM); time.sleep(60)"
    )
    assert done.returncode == -signal.SIGTERM
    assert time.monotonic() - start < 30
    assert done.stderr.strip() == "prog: second stop signal (SIGTERM): ending now, no checkpoint"


def test_a_step_that_outlasts_the_grace_period_is_ended_with_one_line() -> None:
    start = time.monotonic()
    done = watched("os.kill(os.getpid(), signal.SIGTERM); time.sleep(60)", grace=0.5)
    assert done.returncode == 128 + signal.SIGTERM
    assert time.monotonic() - start < 30
    assert done.stderr.strip() == (
        "prog: SIGTERM received 0.5 s ago and the step in progress has not ended: "
        "ending now, no checkpoint"
    )


def test_the_handlers_are_restored_and_the_grace_is_checked() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with PreemptionWatch("prog", grace_s=10) as watch:
        assert signal.getsignal(signal.SIGTERM) == watch._handle
    assert signal.getsignal(signal.SIGTERM) is before
    with pytest.raises(ValueError, match="grace_s: expected a positive number"):
        PreemptionWatch("prog", grace_s=0)
