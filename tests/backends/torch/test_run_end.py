"""How a run ends when the world intervenes: a stop signal (preemption), a full disk, a
second process on the same run folder. Each ends in a state ``--resume`` continues from, and
the command line says what happened in one line.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from safetensors.torch import load_file

import backends.torch.checkpoint as ckpt
from backends.common.jsonl import read_jsonl
from backends.common.preemption import PREEMPTED_EXIT
from backends.torch.__main__ import main as train_main
from backends.torch.run_lock import RunFolderBusyError, acquire_run_lock
from backends.torch.trainer import GRPORecipe, RunResult, train
from tests.helpers.paths import REPO
from tests.helpers.torch_tiny import RESUMABLE, comparable, tiny_config

pytestmark = pytest.mark.usefixtures("single_torch_thread")

# checkpoints at the last step only: a preemption adds its own
UPDATES: dict[str, Any] = {**RESUMABLE, "checkpoint": {"interval": 3}}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    return train(tiny_config(tmp_path_factory.mktemp("reference") / "run", **UPDATES))


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run / "checkpoints" / "step_000003" / "model.safetensors"))


def signal_during_step(monkeypatch: pytest.MonkeyPatch, step: int, signum: int) -> None:
    """Deliver ``signum`` to this process in the middle of ``step`` (after its rollout)."""
    real = GRPORecipe.signals

    def signals(self: GRPORecipe, *args: Any, **kwargs: Any) -> Any:
        if self.step == step:
            os.kill(os.getpid(), signum)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(GRPORecipe, "signals", signals)


# ----------------------------------------------------------------------------- preemption


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_a_stop_signal_mid_step_ends_the_run_after_that_step_and_resume_is_bit_identical(
    tmp_path: Path, reference: RunResult, monkeypatch: pytest.MonkeyPatch, signum: int
) -> None:
    run = tmp_path / "run"
    before = signal.getsignal(signum)
    with monkeypatch.context() as mp:
        signal_during_step(mp, 2, signum)
        stopped = train(tiny_config(run, **UPDATES))
    assert stopped.preempted is not None
    assert (stopped.preempted.signal, stopped.preempted.step) == (signal.Signals(signum).name, 2)
    assert stopped.preempted.checkpoint == run / "checkpoints" / "step_000002"
    assert ckpt.verify_checkpoint(stopped.preempted.checkpoint) == []
    assert signal.getsignal(signum) == before  # the run's handlers are gone with the run
    resumed = train(tiny_config(run, **UPDATES), resume=True)
    assert resumed.preempted is None
    assert [int(r["step"]) for r in resumed.history] == [3]
    got = [comparable(r) for r in read_jsonl(run / "metrics.jsonl")]
    assert got == [comparable(r) for r in reference.history]
    a, b = final_weights(run), final_weights(reference.run_dir)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_signal_during_the_last_step_lets_the_run_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    signal_during_step(monkeypatch, 3, signal.SIGTERM)
    result = train(tiny_config(tmp_path / "run", **UPDATES))
    assert result.preempted is None and result.last_step == 3


# ------------------------------------------------------------------------------ full disk


def enospc_after(monkeypatch: pytest.MonkeyPatch, target: str, budget: int) -> None:
    """Writes through ``target`` (a module attribute: a function taking a path first) fail
    with ENOSPC once ``budget`` bytes of checkpoint files are on disk, leaving the file
    half-written, as a full filesystem does."""
    module_name, attr = target.rsplit(".", 1)
    module = sys.modules[module_name]
    real = getattr(module, attr)

    def write(path: Any, *args: Any, **kwargs: Any) -> Any:
        out = real(path, *args, **kwargs)
        folder = Path(path).parent
        while folder.name and not folder.name.endswith(".tmp"):
            folder = folder.parent
        used = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        if folder.name and used > budget:
            Path(path).write_bytes(Path(path).read_bytes()[: max(0, budget // 8)])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return out

    monkeypatch.setattr(module, attr, write)


@pytest.mark.parametrize(
    "target",
    [
        "backends.torch.checkpoint._write_safetensors",  # rank file, HF export
        "backends.torch.checkpoint._write_text",  # train_state.json, config.json, manifest
    ],
)
def test_a_full_disk_while_a_checkpoint_is_written_is_one_message_and_exit_2(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    target: str,
) -> None:
    run = tmp_path / "run"
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(tiny_config(run, **{**UPDATES, "checkpoint": {"interval": 1}}))
    )
    real_save = GRPORecipe.save

    def save(self: GRPORecipe) -> Path:
        if self.step == 2:  # step 1's checkpoint is written on a disk with room
            enospc_after(monkeypatch, target, budget=1)
        return real_save(self)

    monkeypatch.setattr(GRPORecipe, "save", save)
    status = train_main([str(config)])
    err = capsys.readouterr().err
    assert status == 2
    assert err.count("credit-train: error:") == 1 and "Traceback" not in err
    assert "checkpoint of step 2 could not be written" in err
    assert "No space left on device" in err and "MiB free" in err
    assert "step_000002.tmp was removed" in err and "step_000001, is untouched" in err
    folders = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert folders == ["step_000001"]
    assert ckpt.verify_checkpoint(run / "checkpoints" / "step_000001") == []
    monkeypatch.undo()
    resumed = train(tiny_config(run, **{**UPDATES, "checkpoint": {"interval": 1}}), resume=True)
    assert [int(r["step"]) for r in resumed.history if "reward/mean" in r] == [2, 3]


def test_a_full_disk_inside_dcp_is_the_same_one_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DCP wraps a writer's ``OSError`` in its ``CheckpointException``: still named."""
    from torch.distributed.checkpoint import hf_storage

    def full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "shard.safetensors")

    monkeypatch.setattr(hf_storage.HuggingFaceStorageWriter, "write_data", full)
    state = ckpt.TrainingState(1, {"w": torch.ones(3)}, {}, {}, {}, {})
    with pytest.raises(ckpt.CheckpointWriteError, match="No space left on device") as info:
        ckpt.save_checkpoint(tmp_path / "ckpt", state)
    assert "there is no earlier checkpoint" in str(info.value)
    assert list((tmp_path / "ckpt").iterdir()) == []


# --------------------------------------------------------------------- one owner, real CLI


def hold_lock(folder: Path, then: str = "") -> list[str]:
    code = (
        f"from backends.torch.run_lock import acquire_run_lock; acquire_run_lock({str(folder)!r})"
    )
    return [sys.executable, "-c", code + then]


@pytest.mark.slow
def test_the_lock_names_its_holder_and_is_released_with_it(tmp_path: Path) -> None:
    lock = acquire_run_lock(tmp_path)
    assert json.loads((tmp_path / "run.lock").read_text())["pid"] == os.getpid()
    refused = subprocess.run(hold_lock(tmp_path), cwd=REPO, capture_output=True, text=True)
    assert refused.returncode != 0 and f"PID {os.getpid()} on host" in refused.stderr
    lock.release()
    assert subprocess.run(hold_lock(tmp_path), cwd=REPO, capture_output=True).returncode == 0


def holds_lock(folder: Path, pid: int) -> bool:
    """Whether process ``pid`` has written itself into ``folder``'s lock file (it then holds
    the lock: it writes only after taking it)."""
    try:
        return bool(json.loads((folder / "run.lock").read_text())["pid"] == pid)
    except (OSError, ValueError, KeyError):
        return False


def test_a_killed_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    holder = subprocess.Popen(hold_lock(tmp_path, "; import time; time.sleep(120)"), cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        while not holds_lock(tmp_path, holder.pid):  # read only: taking it would race the child
            assert holder.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        with pytest.raises(RunFolderBusyError, match=f"PID {holder.pid} on host"):
            acquire_run_lock(tmp_path)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    acquire_run_lock(tmp_path).release()


def cli(config: Path, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "backends.torch", str(config), *extra]
    return subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.mark.slow
def test_a_live_run_folder_refuses_a_second_process_and_sigterm_requeues(tmp_path: Path) -> None:
    """The real command: while a run lives, a second start and a ``--resume`` on its folder
    are refused naming it; SIGTERM then stops it after a step, with a checkpoint of that
    step, one line and exit status 75; ``--resume`` continues from there."""
    run = tmp_path / "run"
    config = tmp_path / "run.yaml"
    # far more steps than the test lasts, however slow the machine: the refused starts below
    # may take long under load, and a run that ended on its own would meet SIGTERM in its
    # teardown, after the watch, and die of it
    steps = 100_000
    config.write_text(yaml.safe_dump(tiny_config(run, steps=steps, checkpoint={"interval": 100})))
    live = cli(config)
    try:
        deadline = time.monotonic() + 120
        while not (run / "metrics.jsonl").exists() or len(read_jsonl(run / "metrics.jsonl")) < 2:
            assert live.poll() is None, live.communicate()[1]
            assert time.monotonic() < deadline
            time.sleep(0.1)
        refused = [cli(config, *extra) for extra in ((), ("--resume",))]  # side by side
        for second in refused:
            _, err = second.communicate(timeout=120)
            assert second.returncode == 2, err
            assert err.count("error:") == 1 and "in use by a live run" in err
            assert (
                f"PID {live.pid}" in err and "--resume" not in err.split("error:")[1].split("\n")[0]
            )
        live.send_signal(signal.SIGTERM)
        _, err = live.communicate(timeout=120)
    finally:
        if live.poll() is None:
            live.kill()
    assert live.returncode == PREEMPTED_EXIT, err
    lines = [line for line in err.splitlines() if line.startswith("credit-train:")]
    assert len(lines) == 1 and "SIGTERM received: stopped after step" in lines[0]
    stopped = int(lines[0].split("stopped after step ")[1].split(",")[0])
    assert stopped < steps
    assert (run / "checkpoints" / f"step_{stopped:06d}").is_dir()
    assert int(read_jsonl(run / "metrics.jsonl")[-1]["step"]) == stopped
    resumed = train(tiny_config(run, steps=stopped + 1, checkpoint={"interval": 100}), resume=True)
    assert [int(r["step"]) for r in resumed.history] == [stopped + 1]


AGREE_DRIVER = """
import os, signal, sys
sys.path.insert(0, sys.argv[2])
from backends.torch.__main__ import main
from backends.torch.trainer import GRPORecipe

real = GRPORecipe.signals


def signals(self, *args, **kwargs):
    if self.step == 2 and self.ctx.rank == 1:  # only rank 1 is told to stop
        os.kill(os.getpid(), signal.SIGTERM)
    return real(self, *args, **kwargs)


GRPORecipe.signals = signals
sys.exit(main([sys.argv[1]]))
"""


@pytest.mark.slow
def test_every_rank_stops_at_the_step_where_any_rank_was_signalled(tmp_path: Path) -> None:
    run = tmp_path / "run"
    config = tmp_path / "run.yaml"
    updates = {"steps": 5, "rollout": {"group_size": 4, "prompts_per_step": 4}}
    config.write_text(yaml.safe_dump(tiny_config(run, **updates)))
    driver = tmp_path / "driver.py"
    driver.write_text(AGREE_DRIVER)
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    command = [str(torchrun), "--standalone", "--nproc_per_node", "2", str(driver), str(config)]
    proc = subprocess.run(
        [*command, str(REPO)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    # each worker exits 75; torchrun reports a worker status other than 0 as its own failure
    assert proc.returncode != 0
    assert "exitcode  : 75" in proc.stderr or "exit code: 75" in proc.stderr.lower(), proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.startswith("credit-train:")]
    assert len(lines) == 1 and "SIGTERM received: stopped after step 2" in lines[0]
    saved = run / "checkpoints" / "step_000002"
    assert sorted(p.name for p in saved.glob("rank*.safetensors")) == [
        "rank0.safetensors",
        "rank1.safetensors",
    ]
    assert ckpt.verify_checkpoint(saved) == []
    assert int(read_jsonl(run / "metrics.jsonl")[-1]["step"]) == 2
