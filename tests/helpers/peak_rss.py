"""Peak resident memory of a computation, measured in a fresh, small process.

ru_maxrss is the high-water mark of a process, and a child inherits the parent's mark
across fork/exec (the pytest process is large), so the script forks once more before it
imports torch: the grandchild starts with a clean, small mark. ``current_rss()`` and
``peak_rss()`` (bytes) are defined for the measured code, which reports a JSON object with
``report(...)``. glibc's mmap threshold is fixed at 1 MiB (``MALLOC_MMAP_THRESHOLD_``): by
default glibc raises it after the first large free and keeps freed tile-sized blocks
resident, so figures would measure the allocator's cache (observed 18-116 MiB for the same
call); with it fixed, every block of 1 MiB or more is returned when freed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

PREAMBLE = textwrap.dedent(
    """
    import json, os, resource, sys

    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write_fd)
        with os.fdopen(read_fd) as pipe:
            out = pipe.read()
        _, status = os.waitpid(pid, 0)
        print(out)
        sys.exit(os.waitstatus_to_exitcode(status))

    os.close(read_fd)
    import torch

    def current_rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def peak_rss():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def report(**figures):
        with os.fdopen(write_fd, "w") as pipe:
            pipe.write(json.dumps(figures))
        os._exit(0)
    """
)


def measure(body: str) -> dict[str, Any]:
    """Run ``body`` (Python, dedented, after ``PREAMBLE``) in a fresh grandchild process and
    return what it passed to ``report``."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(2**20)}
    script = PREAMBLE + textwrap.dedent(body)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures
