"""Preemption: a stop signal ends a run after the step in progress, never in the middle of one.

Schedulers warn before they kill: Kubernetes and SLURM send SIGTERM, SLURM sends SIGUSR1
ahead of a time limit when asked (``#SBATCH --signal=USR1@120``). Inside ``PreemptionWatch``
the first such signal is only recorded (``requested``); the training loop reads it at the
end of each step (every rank agreeing on the step, through a collective), writes a
checkpoint, says so in one line and ends with ``PREEMPTED_EXIT``. The process then ends at
once, without a checkpoint, on:

- a second stop signal (one arriving within ``DUPLICATE_WINDOW_S`` of the first is the same
  notice delivered twice, e.g. by a scheduler and by torchrun forwarding it, and is ignored);
- the grace period running out (``grace_s`` after the first signal: a step that hangs).

Each of these prints one line on stderr. Handlers are installed only in the main thread
(Python delivers signals there); elsewhere the watch records nothing.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from types import FrameType, TracebackType
from typing import Any

#: Exit status of a run stopped by a signal after its checkpoint: ``EX_TEMPFAIL`` (sysexits.h,
#: "temporary failure, try again"). SLURM requeues it with ``RequeueExit=75`` (slurm.conf);
#: a Kubernetes Job with a ``podFailurePolicy`` rule ``onExitCodes: {operator: In, values:
#: [75]}`` restarts it without counting a failure.
PREEMPTED_EXIT = 75
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGUSR1)
DUPLICATE_WINDOW_S = 1.0


def signal_name(signum: int) -> str:
    """``"SIGTERM"`` for 15, and so on."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _say(prog: str, text: str) -> None:
    print(f"{prog}: {text}", file=sys.stderr, flush=True)


class PreemptionWatch:
    """Context manager: records the first stop signal while active (see the module docstring).

    ``requested`` is 0 until a stop signal arrives, then its number. ``grace_s=None`` waits for
    the step in progress however long it takes.
    """

    def __init__(self, prog: str, *, grace_s: float | None) -> None:
        if grace_s is not None and grace_s <= 0:
            raise ValueError(f"grace_s: expected a positive number of seconds, got {grace_s}")
        self.prog = prog
        self.grace_s = grace_s
        self.requested = 0
        self._first = 0.0
        self._previous: dict[int, Any] = {}
        self._timer: threading.Timer | None = None

    def __enter__(self) -> PreemptionWatch:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if not self.requested:
            self.requested = signum
            self._first = now
            if self.grace_s is not None:
                self._timer = threading.Timer(self.grace_s, self._expire)
                self._timer.daemon = True
                self._timer.start()
            return
        if now - self._first < DUPLICATE_WINDOW_S:
            return
        _say(self.prog, f"second stop signal ({signal_name(signum)}): ending now, no checkpoint")
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def _expire(self) -> None:
        _say(
            self.prog,
            f"{signal_name(self.requested)} received {self.grace_s:g} s ago and the step in "
            "progress has not ended: ending now, no checkpoint",
        )
        os._exit(128 + self.requested)
