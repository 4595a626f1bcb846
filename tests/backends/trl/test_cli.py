"""``credit-trl``: a complete run from a YAML file, and one-line errors (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

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


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--credit", "nope"], "credit: unknown credit strategy 'nope'"),
        (["--credit", '{"name": "datc", "lam": 2}'], "credit: strategy 'datc': parameter 'lam'"),
        (["--task_params", '{"positions": []}'], "task_params.positions"),
        (["--task", "nope"], "task: unknown task 'nope'"),
        (["--reward_funcs", "nope"], "reward_funcs: unknown reward function 'nope'"),
        (["--reward_funcs", "no_such_pkg_x.f"], "No module named 'no_such_pkg_x'"),
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
