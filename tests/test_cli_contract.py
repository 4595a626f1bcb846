"""Every command line keeps one error contract (``backends.common.cli``).

``credit-train``, ``credit-ablate``, ``credit-openrlhf`` and ``credit-bench``: an expected
failure (bad config, bad input, missing file, package or GPU) prints one message whose
lines start with the program name, exits with status 2 and shows no traceback; with
``--debug`` the same failure raises, with its traceback.
"""

from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch

from ablations.__main__ import main as ablate_main
from backends.common.cli import SILENCED, CommandError
from backends.common.errors import ConfigError
from backends.openrlhf.launcher import main as openrlhf_main
from backends.openrlhf.settings import OpenRLHFCreditConfig
from backends.torch.__main__ import main as train_main
from benchmarks.cli import main as bench_main
from credit_core import CreditError
from tests.helpers.paths import REPO

TRAIN_CONFIG = """\
steps: 1
policy:
  preset: {family: llama}
data:
  task: positional
"""
ABLATE_CONFIG = "strategies: [uniform]\nsettings: [target_tokens]\n"


def assert_one_message(prog: str, status: int, err: str, *fragments: str) -> None:
    assert status == 2, err
    assert err.startswith(f"{prog}: error: "), err
    assert all(line.startswith(f"{prog}: ") or line.startswith("  ") for line in err.splitlines())
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ------------------------------------------------------------------------ credit-train


def test_train_bad_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "run.yaml", TRAIN_CONFIG + "stepz: 3\n")
    status = train_main([str(path)])
    assert_one_message("credit-train", status, capsys.readouterr().err, "stepz: unknown key")


def test_train_missing_config_file(capsys: pytest.CaptureFixture[str]) -> None:
    status = train_main(["no/such/run.yaml"])
    err = capsys.readouterr().err
    assert_one_message("credit-train", status, err, "config file not found", "no/such/run.yaml")


@pytest.mark.usefixtures("no_gpu")
def test_train_cuda_without_a_gpu_is_found_before_anything_is_built(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "run.yaml", TRAIN_CONFIG)
    status = train_main([str(path), "--set", "device=cuda", "--set", f"output_dir={tmp_path}/o"])
    assert_one_message("credit-train", status, capsys.readouterr().err, "device", "device=cpu")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "exc",
    [
        CreditError("CreditBatch.mask: expected a bool tensor"),
        FileNotFoundError(2, "No such file or directory", "prompts.jsonl"),
        ModuleNotFoundError("No module named 'vllm'", name="vllm"),
    ],
)
def test_train_failures_during_the_run(
    exc: Exception,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import backends.torch.trainer

    def train(*args: object, **kwargs: object) -> None:
        raise exc

    monkeypatch.setattr(backends.torch.trainer, "train", train)
    path = write(tmp_path, "run.yaml", TRAIN_CONFIG)
    assert_one_message("credit-train", train_main([str(path)]), capsys.readouterr().err)
    with pytest.raises(type(exc)):
        train_main([str(path), "--debug"])


def test_train_debug_raises(tmp_path: Path) -> None:
    path = write(tmp_path, "run.yaml", TRAIN_CONFIG + "stepz: 3\n")
    with pytest.raises(ConfigError, match="stepz"):
        train_main([str(path), "--debug"])


def test_the_installed_command_prints_no_traceback_unless_asked(tmp_path: Path) -> None:
    """The real process: exit status 2 and one message; ``--debug`` prints the traceback."""
    path = write(tmp_path, "run.yaml", TRAIN_CONFIG + "stepz: 3\n")

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "backends.torch", str(path), *extra]
        return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)

    plain = run()
    assert_one_message("credit-train", plain.returncode, plain.stderr, "stepz")
    debug = run("--debug")
    assert debug.returncode == 1
    assert "Traceback" in debug.stderr and "ConfigError" in debug.stderr


# ----------------------------------------------------------------------- credit-ablate


def test_ablate_bad_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "ablate.yaml", ABLATE_CONFIG + "seedz: [1]\n")
    status = ablate_main([str(path)])
    assert_one_message("credit-ablate", status, capsys.readouterr().err, "seedz")
    with pytest.raises(ConfigError, match="seedz"):
        ablate_main([str(path), "--debug"])


def test_ablate_missing_config_and_bad_strategy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert_one_message(
        "credit-ablate", ablate_main(["no/such.yaml"]), capsys.readouterr().err, "no/such.yaml"
    )
    path = write(tmp_path, "ablate.yaml", "strategies: [uniform, {name: datc, beta: true}]\n")
    status = ablate_main([str(path), "--set", "settings=[target_tokens]"])
    err = capsys.readouterr().err
    assert_one_message("credit-ablate", status, err, "parameter 'beta'", "valid number")


@pytest.mark.usefixtures("no_gpu")
def test_ablate_cuda_without_a_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "ablate.yaml", ABLATE_CONFIG)
    status = ablate_main([str(path), "--set", "train.device=cuda"])
    assert_one_message("credit-ablate", status, capsys.readouterr().err, "train.device")


# --------------------------------------------------------------------- credit-openrlhf


def never_train(cfg: OpenRLHFCreditConfig, argv: Sequence[str]) -> None:
    raise AssertionError("training must not start")


def raising(exc: Exception) -> Callable[[OpenRLHFCreditConfig, Sequence[str]], None]:
    def train(cfg: OpenRLHFCreditConfig, argv: Sequence[str]) -> None:
        raise exc

    return train


def test_openrlhf_bad_credit_flags_and_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = openrlhf_main(["--credit", "datc", "--credit.beta", "true"], train=never_train)
    assert_one_message("credit-openrlhf", status, capsys.readouterr().err, "parameter 'beta'")
    status = openrlhf_main(["--credit.config", "no/such.yaml"], train=never_train)
    assert_one_message("credit-openrlhf", status, capsys.readouterr().err, "no/such.yaml")
    with pytest.raises(CreditError, match="beta"):
        openrlhf_main(["--credit", "datc", "--credit.beta=-1", "--debug"], train=never_train)


def test_openrlhf_without_flash_attn(capsys: pytest.CaptureFixture[str]) -> None:
    """What ``credit-openrlhf --credit datc`` meets on a machine without flash_attn."""
    missing = ModuleNotFoundError("No module named 'flash_attn'", name="flash_attn")
    status = openrlhf_main(["--credit", "datc"], train=raising(missing))
    err = capsys.readouterr().err
    assert_one_message("credit-openrlhf", status, err, "'flash_attn' is not installed")
    with pytest.raises(ModuleNotFoundError):
        openrlhf_main(["--credit", "datc", "--debug"], train=raising(missing))


def test_openrlhf_passes_no_debug_flag_on() -> None:
    seen: list[list[str]] = []

    def train(cfg: OpenRLHFCreditConfig, argv: Sequence[str]) -> None:
        seen.append(list(argv))

    assert openrlhf_main(["--debug", "--actor.model_name_or_path", "m"], train=train) == 0
    assert seen == [["--actor.model_name_or_path", "m"]]


def test_openrlhf_numbers_in_flags_are_typed() -> None:
    got: list[OpenRLHFCreditConfig] = []

    def train(cfg: OpenRLHFCreditConfig, argv: Sequence[str]) -> None:
        got.append(cfg)

    assert openrlhf_main(["--credit", "datc", "--credit.beta", "1e-3"], train=train) == 0
    assert got[0].credit.params["beta"] == 0.001


# ------------------------------------------------------------------------ credit-bench


@pytest.mark.usefixtures("no_gpu")
def test_bench_cuda_without_a_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["signals", "--quick", "--device", "cuda", "--out", str(tmp_path)]
    status = bench_main(argv)
    assert_one_message("credit-bench", status, capsys.readouterr().err, "--device cuda")
    with pytest.raises(CommandError):
        bench_main([*argv, "--debug"])


@pytest.mark.parametrize(
    ("exc", "fragment"),
    [
        (PermissionError(13, "Permission denied", "/dev/nvidia0"), "permission denied: '/dev/"),
        (FileNotFoundError(2, "No such file", "runs/bench"), "no such file or directory: 'runs/"),
        (CreditError("chunk_size: expected an integer >= 1, got 0"), "chunk_size: expected"),
    ],
)
def test_bench_failures(
    exc: Exception,
    fragment: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import benchmarks.cli

    def failing(name: str) -> torch.device:
        raise exc

    monkeypatch.setattr(benchmarks.cli, "_device", failing)
    argv = ["signals", "--quick", "--out", str(tmp_path)]
    assert_one_message("credit-bench", bench_main(argv), capsys.readouterr().err, fragment)
    with pytest.raises(type(exc)):
        bench_main([*argv, "--debug"])


# ------------------------------------------------------------------- third-party noise

ACCELERATOR_LINE = "Setting accelerator to CPU"


def test_credit_ablate_prints_no_deepspeed_accelerator_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import ablations.__main__ as cli

    def work(argv: list[str]) -> int:
        """A worker's DeepSpeed logger, as deepspeed.utils.logging configures it."""
        ds = logging.getLogger("DeepSpeed")
        monkeypatch.setattr(ds, "propagate", False)
        handler = logging.StreamHandler(sys.stdout)
        ds.addHandler(handler)
        try:
            ds.warning(f"{ACCELERATOR_LINE}. If you have GPU or other accelerator, ...")
            ds.warning("another DeepSpeed warning")
        finally:
            ds.removeHandler(handler)
        return 0

    monkeypatch.setattr(cli, "_ablate", work)
    monkeypatch.setattr(logging.getLogger("DeepSpeed"), "filters", [])  # none from other tests
    assert cli.main([]) == 0
    out = capsys.readouterr().out
    assert ACCELERATOR_LINE not in out
    assert "another DeepSpeed warning" in out  # only that line is dropped


def test_the_silenced_line_is_the_one_the_installed_deepspeed_logs() -> None:
    """DeepSpeed's logger and message are what ``backends.common.cli.SILENCED`` names (read from
    its source: importing DeepSpeed takes 10 s and more)."""
    spec = importlib.util.find_spec("deepspeed")
    if spec is None or spec.origin is None:
        pytest.skip("deepspeed is not installed")
    package = Path(spec.origin).parent
    assert 'create_logger(name="DeepSpeed"' in (package / "utils" / "logging.py").read_text()
    accelerator = (package / "accelerator" / "real_accelerator.py").read_text()
    assert f'accel_logger.warning(\n                    "{ACCELERATOR_LINE}.' in accelerator
    assert SILENCED["DeepSpeed"] == (ACCELERATOR_LINE,)
