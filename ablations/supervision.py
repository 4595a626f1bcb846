"""Worker processes of an ablation: what each is doing, and the supervisor that ends the
runner when one fails.

A worker (``python -m ablations CONFIG --shard i/n``) keeps a status file under
``<output_dir>/.workers/``: its task (the assets or run it is on) and the file whose growth
shows its progress (the run's metrics file). ``supervise`` waits for the workers of one phase
and reads those files to say which worker failed, hung or was signalled, on which task.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from backends.common.cli import CommandError
from backends.common.preemption import PreemptionWatch, signal_name

WORKERS_DIR = ".workers"


class RunStoppedError(Exception):
    """A stop signal ended the ablation; finished runs are kept and a rerun continues."""


class WorkerFailedError(CommandError):
    """A worker process died, hung or failed; the message names it and its run."""


def status_file(out: Path, shard_index: int) -> Path:
    """The status file of worker ``shard_index`` under the output folder ``out``."""
    return out / WORKERS_DIR / f"worker-{shard_index}.json"


def set_status(out: Path, shard_index: int, task: str, progress: Path | None = None) -> None:
    """What worker ``shard_index`` does now (``task``), and the file whose growth shows its
    progress (a run's metrics file); the runner reads it to name a worker that fails."""
    file = status_file(out, shard_index)
    file.parent.mkdir(parents=True, exist_ok=True)
    doc = {"task": task, "progress": str(progress) if progress else None}
    tmp = file.with_name(file.name + ".tmp")
    tmp.write_text(json.dumps(doc), encoding="utf-8")
    os.replace(tmp, file)  # the runner never reads a half-written status


def last_progress(out: Path, index: int) -> tuple[str, float]:
    """Worker ``index``'s task and the time it last showed progress (0: never). A status
    file that cannot be read as a whole still shows progress by its time."""
    file = status_file(out, index)
    try:
        seen = file.stat().st_mtime
    except OSError:
        return "start-up", 0.0
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
        task = str(doc["task"])
        if doc.get("progress") and Path(doc["progress"]).exists():
            seen = max(seen, Path(doc["progress"]).stat().st_mtime)
    except (OSError, ValueError, KeyError, TypeError):
        return "its task (status unreadable)", seen
    return task, seen


def _exit_text(code: int) -> str:
    return f"killed by {signal_name(-code)}" if code < 0 else f"exit status {code}"


def _failed_worker(
    procs: list[subprocess.Popen[bytes]], out: Path, since: float, timeout_s: float
) -> str | None:
    """The first worker that ended badly or shows no progress for ``timeout_s`` (killed
    then), described; None while all are well."""
    for i, p in enumerate(procs):
        task, seen = last_progress(out, i)
        code = p.poll()
        if code not in (None, 0):
            return f"worker {i} ended ({_exit_text(code)}) during {task}"
        if code is None and time.time() - max(seen, since) > timeout_s:
            p.kill()
            return (
                f"worker {i} showed no progress for {timeout_s:g} s during {task} "
                "(worker_timeout_s) and was killed"
            )
    return None


def supervise(
    procs: list[subprocess.Popen[bytes]], out: Path, timeout_s: float, phase: str
) -> None:
    """Wait for every worker of ``phase`` to end; raise as ``run_workers`` says otherwise."""
    started = time.time()
    failure = None
    with PreemptionWatch("credit-ablate", grace_s=None) as watch:
        try:
            while any(p.poll() is None for p in procs) and not watch.requested:
                failure = _failed_worker(procs, out, started, timeout_s)
                if failure:
                    break
                time.sleep(0.2)
            if watch.requested:
                busy = [p for p in procs if p.poll() is None]
                tasks = [last_progress(out, procs.index(p))[0] for p in busy]
                for p in busy:
                    p.send_signal(watch.requested)
                for p in procs:
                    p.wait()
                raise RunStoppedError(
                    f"{signal_name(watch.requested)} received: the {phase} phase was stopped "
                    f"({', '.join(tasks) or 'no worker was busy'}); finished runs are kept, "
                    "run the same command to continue"
                )
        finally:
            for p in procs:
                if p.poll() is None:
                    p.terminate()
                    try:
                        p.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait()
    if failure is None:
        failure = ", ".join(
            f"worker {i} ended ({_exit_text(p.returncode)}) during {last_progress(out, i)[0]}"
            for i, p in enumerate(procs)
            if p.returncode
        )
    if failure:
        raise WorkerFailedError(
            f"ablation {phase} phase: {failure}; the other workers were stopped; finished runs "
            "are kept, run the same command to continue (a failed run prints its traceback above)"
        )
