"""``credit-trl``: a complete run from a YAML file, and one-line errors (exit 2)."""

from __future__ import annotations

import errno
import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from backends.common.preemption import PREEMPTED_EXIT
from backends.trl.cli import main
from tests.helpers.paths import REPO

CONFIG = str(REPO / "configs" / "trl" / "tiny_datc.yaml")


def test_tiny_datc_config_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two steps of the tiny config, with one evaluation (TRL's eval loop also gets credit)."""
    argv = ["--config", CONFIG, "--max_steps", "2", "--output_dir", str(tmp_path)]
    argv += ["--logging_steps", "1", "--eval_strategy", "steps", "--eval_steps", "2"]
    assert main([*argv, "--per_device_eval_batch_size", "32"]) == 0
    out = capsys.readouterr().out
    assert "'credit/weight_max'" in out and "'eval_credit/weight_max'" in out
    assert "held-out positional reward" in out
    assert (tmp_path / "model.safetensors").exists()


@pytest.mark.parametrize("credit", ["entropy_top", '{"name": "red", "eps": 0.001}'])
def test_a_published_baseline_runs_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], credit: str
) -> None:
    argv = ["--config", CONFIG, "--max_steps", "1", "--output_dir", str(tmp_path)]
    assert main([*argv, "--logging_steps", "1", "--credit", credit]) == 0
    assert "'credit/uniform_fallbacks'" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--credit", "nope"], "credit: unknown credit strategy 'nope'"),
        (["--credit", '{"name": "datc", "lam": 2}'], "credit: strategy 'datc': parameter 'lam'"),
        (["--task_params", '{"positions": []}'], "task_params.positions"),
        (["--task", "nope"], "task: unknown task 'nope'"),
        (["--reward_funcs", "nope"], "reward_funcs: unknown reward function 'nope'"),
        (["--reward_funcs", "no_such_pkg_x.f"], "No module named 'no_such_pkg_x'"),
        (["--credit", "abc"], "strategy 'abc' reads the direction model's attention"),
    ],
)
def test_expected_failures_exit_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main(["--config", CONFIG, "--output_dir", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("credit-trl: error: ")
    assert "Traceback" not in err


def test_missing_config_file_and_debug(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", str(tmp_path / "none.yaml")]) == 2
    assert "none.yaml" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError):
        main(["--config", str(tmp_path / "none.yaml"), "--debug"])


# ------------------------------------------------------------------ preemption, full disk


def short_run(tmp_path: Path, *extra: str) -> list[str]:
    """The tiny config, 3 steps, a checkpoint after every step, small batches."""
    argv = ["--config", CONFIG, "--output_dir", str(tmp_path), "--max_steps", "3"]
    argv += ["--save_strategy", "steps", "--save_steps", "1", "--eval_samples_per_prompt", "0"]
    return [*argv, "--per_device_train_batch_size", "16", *extra]


def during_step(monkeypatch: pytest.MonkeyPatch, step: int, action: Callable[[], None]) -> None:
    """Run ``action`` in the middle of training step ``step`` (1-based)."""
    from backends.trl.trainer import CreditGRPOTrainer

    real = CreditGRPOTrainer.training_step

    def training_step(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.state.global_step == step - 1:
            action()
        return real(self, *args, **kwargs)

    monkeypatch.setattr(CreditGRPOTrainer, "training_step", training_step)


def test_sigterm_saves_a_checkpoint_after_the_step_and_exits_75(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    before = signal.getsignal(signal.SIGTERM)
    with monkeypatch.context() as mp:
        during_step(mp, 2, lambda: os.kill(os.getpid(), signal.SIGTERM))
        assert main(short_run(tmp_path)) == PREEMPTED_EXIT
    out = capsys.readouterr().out
    assert "credit-trl: SIGTERM received: stopped after step 2" in out
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    assert signal.getsignal(signal.SIGTERM) == before
    assert main(short_run(tmp_path, "--resume_from_checkpoint", "true")) == 0
    state = json.loads((tmp_path / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["global_step"] == 3


def test_a_full_disk_while_saving_is_one_line_exit_2_and_no_incomplete_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from backends.trl.trainer import CreditGRPOTrainer

    real = CreditGRPOTrainer._save_rng_state

    def save_rng_state(self: Any, output_dir: str) -> None:
        if self.state.global_step == 2:  # after the weights, before trainer_state.json
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), f"{output_dir}/rng_state.pth")
        real(self, output_dir)

    monkeypatch.setattr(CreditGRPOTrainer, "_save_rng_state", save_rng_state)
    assert main(short_run(tmp_path)) == 2
    err = capsys.readouterr().err
    assert err.count("credit-trl: error:") == 1 and "Traceback" not in err
    assert "failed at step 2: No space left on device" in err and "MiB free" in err
    assert "checkpoint-2 was removed" in err
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-1"]
