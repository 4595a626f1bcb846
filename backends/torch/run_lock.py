"""One owner per run folder: a live run holds an OS advisory lock on ``<run>/run.lock``.

The lock is ``flock(LOCK_EX | LOCK_NB)`` on a file descriptor the run keeps open; the kernel
drops it when the process ends however it ends (a kill -9 included), so a stale lock cannot
outlive its run. The file also says who holds it (PID, host, since when), for the refusal
message of a second start; that text is only informative, the lock is the kernel's.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import socket
from pathlib import Path

from backends.common.errors import ConfigError

LOCK_FILE = "run.lock"


class RunFolderBusyError(ConfigError):
    """Another live process holds the run folder; the message names it."""


class RunLock:
    """The held lock of one run folder; ``release()`` (or process exit) frees it."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
        return f"PID {info['pid']} on host {info['host']}, since {info['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process (its PID is not recorded yet)"


def acquire_run_lock(run_dir: str | Path) -> RunLock:
    """Lock ``run_dir`` (created if missing) for this process.

    Raises ``RunFolderBusyError`` naming the holder (PID, host, start time) if a live process holds
    it. The descriptor is not inherited by child processes (``O_CLOEXEC``).
    """
    path = Path(run_dir) / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RunFolderBusyError(
            f"output_dir: {str(path.parent)!r} is in use by a live run ({_holder(path)}); "
            "wait for it to end or stop it, or choose another output_dir"
        ) from None
    since = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    info = {"pid": os.getpid(), "host": socket.gethostname(), "since": since}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(info).encode(), 0)
    return RunLock(path, fd)
