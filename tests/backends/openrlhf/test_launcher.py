"""``credit-openrlhf``: credit flags are consumed, everything else reaches OpenRLHF unchanged,
and every credit/version problem is reported before anything (Ray included) starts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
import ray

from backends.openrlhf import launcher, version
from backends.openrlhf.launcher import main, split_argv
from backends.openrlhf.settings import OpenRLHFCreditConfig
from credit_core import CreditError
from tests.helpers.paths import REPO

OPENRLHF_FLAGS = [
    "--actor.model_name_or_path",
    "/models/policy",
    "--algo.advantage.estimator",
    "group_norm",
    "--reward.clip_range",
    "-10",
    "10",
    "--algo.kl.use_loss",
    "--rollout.n_samples_per_prompt=4",
    "--data.input_template",
    "User: {}\nAssistant:",
]


class Recorder:
    """Stands in for the training run: records what it was given."""

    def __init__(self) -> None:
        self.calls: list[tuple[OpenRLHFCreditConfig, list[str]]] = []

    def __call__(self, cfg: OpenRLHFCreditConfig, argv: Sequence[str]) -> None:
        self.calls.append((cfg, list(argv)))


def test_credit_flags_are_consumed_and_the_rest_passes_through_in_order() -> None:
    argv = [
        OPENRLHF_FLAGS[0],
        OPENRLHF_FLAGS[1],
        "--credit",
        "datc",
        *OPENRLHF_FLAGS[2:7],
        "--credit.beta=2.0",
        *OPENRLHF_FLAGS[7:],
        "--credit.direction.path",
        "/models/rm",
        "--credit.placement",
        "policy",
    ]
    found, rest = split_argv(argv)
    assert rest == OPENRLHF_FLAGS
    assert found.name == "datc"
    assert found.params == {"beta": "2.0"}
    assert found.direction == {"path": "/models/rm"}
    assert found.backend == {"placement": "policy"}


def test_main_hands_typed_settings_and_untouched_flags_to_training() -> None:
    train = Recorder()
    status = main(
        ["--credit", "datc_shuffled", "--credit.lam", "0.25", "--credit.seed=3", *OPENRLHF_FLAGS],
        train=train,
    )
    assert status == 0
    [(cfg, argv)] = train.calls
    assert argv == OPENRLHF_FLAGS
    assert cfg.credit.name == "datc_shuffled"
    assert cfg.credit.params == {"lam": 0.25, "seed": 3}  # as given, validated once
    assert cfg.placement == "auto"


def test_without_credit_flags_the_strategy_is_uniform() -> None:
    train = Recorder()
    assert main(list(OPENRLHF_FLAGS), train=train) == 0
    [(cfg, argv)] = train.calls
    assert cfg.credit.name == "uniform" and cfg.credit.params == {}
    assert argv == OPENRLHF_FLAGS


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--credit"], "flag --credit expects a value"),
        (["--credit.beta", "--actor.model_name_or_path", "x"], "--credit.beta expects a value"),
        (["--credits", "datc"], "unknown flag --credits"),
        (["--credit.", "1"], "expected --credit.<param>"),
        (["--credit.direction", "x"], "expected --credit.direction.<field>"),
        (["--credit.direction.", "x"], "expected --credit.direction.<field>"),
        (["--credit", "datc", "--credit=uniform"], "flag --credit is given twice"),
    ],
)
def test_malformed_credit_flags_are_named(argv: list[str], message: str) -> None:
    with pytest.raises(CreditError, match=re.escape(message)):
        split_argv(argv)


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (["--credit", "nope"], ["nope", "datc", "uniform"]),
        (["--credit", "datc", "--credit.beta", "-1"], ["beta", "greater than 0"]),
        (["--credit", "datc", "--credit.gamma", "1"], ["unknown parameter 'gamma'"]),
        (["--credit", "uniform", "--credit.lam", "0.5"], ["unknown parameter 'lam'"]),
        (["--credit", "datc", "--credit.placement", "gpu"], ["placement", "'auto'"]),
        (["--credit", "datc", "--credit.stats_chunk_size", "0"], ["stats_chunk_size"]),
        (  # refused, not dropped: OpenRLHF measures the agreement but applies no gate
            ["--credit", "datc", "--credit.gate", "{agreement: [0.2, 0.6]}"],
            ["credit.gate: this backend does not apply the agreement gate"],
        ),
        (["--credit.config", "/no/such/file.yaml"], ["--credit.config", "/no/such/file.yaml"]),
    ],
)
def test_bad_settings_stop_before_training_with_exit_status_2(
    argv: list[str], fragments: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    train = Recorder()
    assert main([*argv, *OPENRLHF_FLAGS], train=train) == 2
    assert train.calls == []
    err = capsys.readouterr().err
    assert err.startswith("credit-openrlhf: error:")
    for fragment in fragments:
        assert fragment in err


def test_config_file_is_read_and_flags_override_it(tmp_path: Path) -> None:
    config = tmp_path / "credit.yaml"
    config.write_text(
        "credit: {name: datc, beta: 2.0, lam: 0.75}\nplacement: policy\nstats_chunk_size: 64\n"
    )
    train = Recorder()
    status = main(
        ["--credit.config", str(config), "--credit.lam", "0.25", *OPENRLHF_FLAGS], train=train
    )
    assert status == 0
    [(cfg, argv)] = train.calls
    assert argv == OPENRLHF_FLAGS
    assert cfg.credit.name == "datc"
    assert cfg.credit.params == {"beta": 2.0, "lam": 0.25}
    assert (cfg.placement, cfg.stats_chunk_size) == ("policy", 64)


def test_config_file_short_form_and_strategy_switch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "credit.yaml"
    config.write_text("credit: {name: datc, beta: 2.0}\n")
    train = Recorder()
    assert main(["--credit.config", str(config), "--credit", "uniform"], train=train) == 0
    assert train.calls[0][0].credit.name == "uniform"
    assert "its parameters {'beta': 2.0} are not used" in capsys.readouterr().err
    config.write_text("credit: datc_inverse\n")
    assert main(["--credit.config", str(config)], train=train) == 0
    assert train.calls[1][0].credit.name == "datc_inverse"


def test_the_example_config_file_is_valid() -> None:
    train = Recorder()
    assert main(["--credit.config", str(REPO / "configs/openrlhf/datc.yaml")], train=train) == 0
    [(cfg, _)] = train.calls
    assert cfg.credit.name == "datc" and cfg.placement == "auto"


def test_direction_flags_are_validated_by_the_adapters_config(
    capsys: pytest.CaptureFixture[str],
) -> None:
    train = Recorder()
    flags = ["--credit", "datc", "--credit.direction.kind", "seq_classification"]
    assert (
        main(
            [*flags, "--credit.direction.path", "/rm", "--credit.direction.dtype", "bfloat16"],
            train=train,
        )
        == 0
    )
    assert train.calls[0][0].direction == {
        "kind": "seq_classification",
        "path": "/rm",
        "dtype": "bfloat16",
    }
    assert main([*flags, "--credit.direction.target_text", "x"], train=train) == 2
    assert "target_text: not a setting of kind 'seq_classification'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("placement: policy\n", "expected a YAML mapping with a 'credit' key"),
        ("credit: datc\nreward_model: x\n", "unknown key 'reward_model'"),
        ("credit: [datc]\n", "credit"),
        ("credit: datc\n  bad: [\n", "not valid YAML"),
    ],
)
def test_bad_config_files_are_rejected_with_the_key(
    tmp_path: Path, text: str, fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "credit.yaml"
    config.write_text(text)
    train = Recorder()
    assert main(["--credit.config", str(config)], train=train) == 2
    assert train.calls == []
    assert fragment in capsys.readouterr().err


@pytest.mark.parametrize("found", ["0.10.3", "0.12.0", "1.11.0", None])
def test_unsupported_openrlhf_version_stops_before_training(
    found: str | None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(version, "installed_openrlhf_version", lambda: found)
    train = Recorder()
    assert main(["--credit", "datc", *OPENRLHF_FLAGS], train=train) == 2
    assert train.calls == []
    err = capsys.readouterr().err
    assert "0.11.x" in err
    assert (found or "not installed") in err


@pytest.mark.parametrize("found", ["0.11.0", "0.11.2", "0.11.10", "0.11.3rc1", "0.11.2+local"])
def test_supported_versions(found: str) -> None:
    assert version.check_openrlhf_version(found) == found


def test_installed_openrlhf_is_supported() -> None:
    assert version.check_openrlhf_version().startswith("0.11.")


def test_python_dash_m_reports_bad_flags_without_starting_anything() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "backends.openrlhf", "--credit", "bogus", "--actor.x", "y"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "credit-openrlhf: error:" in proc.stderr and "bogus" in proc.stderr


def test_help_lists_credit_flags_then_openrlhf_flags(capsys: pytest.CaptureFixture[str]) -> None:
    from tests.helpers.openrlhf_stubs import install_openrlhf_stubs

    install_openrlhf_stubs()
    train = Recorder()
    assert main(["--help"], train=train) == 0
    assert train.calls == []
    out = capsys.readouterr().out
    for flag in ("--credit NAME", "--credit.config FILE", "--credit.<param>", "--credit.direction"):
        assert flag in out
    assert "datc_shuffled" in out
    assert out.index("--credit.config") < out.index("--algo.advantage.estimator")


def test_openrlhf_parses_the_passed_through_flags(capsys: pytest.CaptureFixture[str]) -> None:
    from tests.helpers.openrlhf import openrlhf_args

    args = openrlhf_args(list(OPENRLHF_FLAGS))
    assert args.algo.advantage.estimator == "group_norm"
    assert args.reward.clip_range == [-10.0, 10.0]
    assert args.rollout.n_samples_per_prompt == 4
    assert args.data.input_template == "User: {}\nAssistant:"
    with pytest.raises(SystemExit):
        openrlhf_args(["--credit", "datc"])  # OpenRLHF itself does not know credit flags
    assert "unrecognized arguments: --credit datc" in capsys.readouterr().err


def test_incompatible_openrlhf_settings_fail_before_ray_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The real train_ppo_ray runs up to its parser; the credit check stops it there."""
    from tests.helpers.openrlhf_stubs import install_openrlhf_stubs

    install_openrlhf_stubs()
    import openrlhf.trainer.ppo_trainer as sync_trainer

    stock_trainer = sync_trainer.PPOTrainer

    def no_ray(*args: object, **kwargs: object) -> None:
        raise AssertionError("ray.init must not be reached")

    monkeypatch.setattr(ray, "init", no_ray)
    cfg, argv = launcher.parse_command_line(
        [
            "--credit",
            "datc",
            "--credit.direction.kind",
            "seq_classification",
            "--credit.direction.path",
            "/models/rm",
            "--actor.model_name_or_path",
            "/models/policy",
            "--algo.advantage.estimator",
            "gae",
            "--ds.tensor_parallel_size",
            "2",
        ]
    )
    with pytest.raises(CreditError) as info:
        launcher.train_with_credit(cfg, argv)
    text = str(info.value)
    assert "--rollout.n_samples_per_prompt: 1; under a critic" in text
    assert "--ds.tensor_parallel_size > 1" in text
    assert sync_trainer.PPOTrainer is stock_trainer  # hooks are removed afterwards
