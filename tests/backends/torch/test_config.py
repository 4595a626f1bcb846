"""Trainer configs: YAML + ``--set``; every error names the key and where it came from."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from backends.torch.__main__ import main
from backends.torch.config import (
    ConfigError,
    apply_overrides,
    check_batch_split,
    check_device,
    config_from_dict,
    dump_config,
    load_config,
)
from credit_core import get_strategy

BASE = """\
seed: 1
steps: 3
credit: datc
policy:
  preset: {family: llama}
data:
  task: positional
rollout:
  group_size: 4
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def error_of(path: Path, overrides: list[str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides or [])
    return str(info.value)


def test_a_valid_config_loads_with_defaults(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, BASE))
    assert cfg.credit.name == "datc" and cfg.credit.params == {}
    assert cfg.rollout.group_size == 4 and cfg.rollout.top_k == 0 and cfg.rollout.top_p == 1.0
    assert cfg.algorithm.loss_agg == "token_mean"


def test_unknown_key_names_the_key_its_yaml_line_and_the_allowed_keys(tmp_path: Path) -> None:
    msg = error_of(write(tmp_path, BASE + "  temprature: 0.7\n"))
    assert "rollout.temprature: unknown key" in msg
    assert f"{tmp_path / 'run.yaml'}:10" in msg
    assert "temperature" in msg  # listed among the allowed keys


def test_unknown_top_level_key(tmp_path: Path) -> None:
    msg = error_of(write(tmp_path, BASE + "stepz: 4\n"))
    assert "stepz: unknown key" in msg and "run.yaml:10" in msg


def test_bad_type_names_the_key_and_the_value(tmp_path: Path) -> None:
    msg = error_of(write(tmp_path, BASE + "algorithm:\n  clip_eps_low: abc\n"))
    assert "algorithm.clip_eps_low" in msg and "'abc'" in msg and "run.yaml:11" in msg


def test_missing_model_path(tmp_path: Path) -> None:
    text = BASE.replace("preset: {family: llama}", f"path: {tmp_path / 'no_model'}")
    msg = error_of(write(tmp_path, text))
    assert "policy.path" in msg and "no Hugging Face model folder" in msg and "run.yaml:5" in msg


def test_group_size_one_is_rejected_with_the_reason(tmp_path: Path) -> None:
    msg = error_of(write(tmp_path, BASE.replace("group_size: 4", "group_size: 1")))
    assert "rollout.group_size: must be >= 2" in msg and "run.yaml:9" in msg


@pytest.mark.parametrize("setting", ["top_p: 0.9", "top_k: 50"])
def test_datc_with_truncated_sampling_is_rejected(tmp_path: Path, setting: str) -> None:
    key = setting.split(":")[0]
    msg = error_of(write(tmp_path, BASE + f"  {setting}\n"))
    assert f"rollout.{key}" in msg and "'datc'" in msg and "policy_stats" in msg


@pytest.mark.parametrize("strategy", ["uniform", "saliency"])
def test_truncated_sampling_is_fine_without_policy_stats(tmp_path: Path, strategy: str) -> None:
    cfg = load_config(write(tmp_path, BASE + "  top_p: 0.9\n"), [f"credit={strategy}"])
    assert cfg.rollout.top_p == 0.9


def test_gae_defaults_follow_the_ppo_recipes(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, BASE), ["credit=uniform", "algorithm.estimator=gae"])
    assert (cfg.algorithm.gamma, cfg.algorithm.lam) == (1.0, 0.95)
    assert cfg.critic.value_clip == 0.5  # verl critic.cliprange_value, OpenRLHF value_clip
    assert cfg.critic.learning_rate(cfg.optim.lr) == 10 * cfg.optim.lr
    assert load_config(write(tmp_path, BASE), ["critic.lr=0.002"]).critic.learning_rate(1.0) == 2e-3


@pytest.mark.parametrize("strategy", ["datc", "red", "{name: abc, mode: paper}"])
def test_gae_serves_a_strategy_that_moves_the_outcome_reward(tmp_path: Path, strategy: str) -> None:
    """docs/design.md, "Credit under a critic"."""
    cfg = load_config(write(tmp_path, BASE), [f"credit={strategy}", "algorithm.estimator=gae"])
    assert cfg.algorithm.estimator == "gae"
    assert get_strategy(cfg.credit).critic_reward_form is not None


@pytest.mark.parametrize("strategy", ["ktae", "prime", "entropy_top"])
def test_gae_refuses_a_strategy_without_a_token_reward_form(tmp_path: Path, strategy: str) -> None:
    msg = error_of(write(tmp_path, BASE), [f"credit={strategy}", "algorithm.estimator=gae"])
    assert "algorithm.estimator:" in msg and f"credit strategy {strategy!r}" in msg
    assert "has no token-reward form for a critic" in msg
    assert "['dr_grpo', 'group_norm', 'rloo']" in msg


def test_credit_short_and_long_forms(tmp_path: Path) -> None:
    short = load_config(write(tmp_path, BASE))
    long = load_config(
        write(tmp_path, BASE.replace("credit: datc", "credit: {name: datc, beta: 2.0}"))
    )
    assert short.credit.name == long.credit.name == "datc"
    assert long.credit.params == {"beta": 2.0}


def test_bad_credit_parameter_names_it(tmp_path: Path) -> None:
    msg = error_of(write(tmp_path, BASE.replace("credit: datc", "credit: {name: datc, lam: 3}")))
    assert "credit" in msg and "lam" in msg


def test_set_overrides_nested_typed_values(tmp_path: Path) -> None:
    cfg = load_config(
        write(tmp_path, BASE),
        [
            "rollout.temperature=0.7",
            "algorithm.kl_coef=0.01",
            "logging.progress=false",
            "credit.beta=2.0",
            "optim.betas=[0.9, 0.95]",
        ],
    )
    assert cfg.rollout.temperature == 0.7
    assert cfg.algorithm.kl_coef == 0.01
    assert cfg.logging.progress is False
    assert cfg.credit.name == "datc" and cfg.credit.params == {"beta": 2.0}
    assert cfg.optim.betas == (0.9, 0.95)


def test_set_can_switch_the_strategy(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, BASE), ["credit.name=uniform"]).credit.name == "uniform"


def test_errors_from_set_cite_the_set_argument(tmp_path: Path) -> None:
    msg = error_of(write(tmp_path, BASE), ["rollout.group_sise=8"])
    assert "rollout.group_sise: unknown key" in msg and "--set rollout.group_sise=8" in msg


def test_malformed_set_argument() -> None:
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        apply_overrides({}, ["rollout.temperature"])


def test_resolved_config_round_trips(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, BASE), ["credit.beta=2.0"])
    dump_config(cfg, tmp_path / "resolved.yaml")
    again = load_config(tmp_path / "resolved.yaml")
    assert again == cfg
    assert yaml.safe_load((tmp_path / "resolved.yaml").read_text())["credit"] == {
        "name": "datc",
        "beta": 2.0,
    }


@pytest.mark.parametrize(
    "reward",
    [
        {"direction_model": {"kind": "encoder_similarity", "target_text": "a happy dog"}},
        {
            "direction_model": {"kind": "module", "factory": "pkg.mod:build"},
            "reward": {"kind": "callable", "function": "pkg.mod:score"},
        },
        {
            "reward": {
                "kind": "prm",
                "model": {"kind": "module", "factory": "pkg.mod:build"},
                "step_separator": "\n",
            }
        },
    ],
)
def test_a_resolved_reward_section_round_trips(tmp_path: Path, reward: dict[str, object]) -> None:
    """Every default written out (``factory: null`` under ``encoder_similarity``, ``model:
    null`` under a callable reward) reads back as the same config, so a run with a
    reward model can be resumed."""
    cfg = load_config(write(tmp_path, BASE), [f"reward={yaml.safe_dump(reward)}"])
    dump_config(cfg, tmp_path / "resolved.yaml")
    assert load_config(tmp_path / "resolved.yaml") == cfg
    with pytest.raises(ConfigError, match="factory: not a setting of kind 'encoder_similarity'"):
        load_config(
            write(tmp_path, BASE),
            ["reward.direction_model={kind: encoder_similarity, target_text: t, factory: a:b}"],
        )
    with pytest.raises(ConfigError, match=r"reward\.reward: .*step_separator: required for kind"):
        load_config(
            write(tmp_path, BASE),
            ["reward.reward={kind: prm, model: {kind: module, factory: a:b}}"],
        )


def test_data_needs_exactly_one_source() -> None:
    with pytest.raises(ConfigError, match=r"data: .*exactly one of 'task'"):
        config_from_dict({"policy": {"preset": {}}, "data": {}})


def test_cli_reports_config_errors_and_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, BASE.replace("group_size: 4", "group_size: 1"))
    assert main([str(path)]) == 2
    assert "rollout.group_size" in capsys.readouterr().err


def test_task_and_task_parameters_are_checked_with_the_config(tmp_path: Path) -> None:
    msg = error_of(write(tmp_path, BASE.replace("task: positional", "task: positionl")))
    assert "data.task: unknown task" in msg and "positional" in msg and "run.yaml:7" in msg
    text = BASE.replace("task: positional", "task: positional\n  task_params: {embed_dimm: 4}")
    msg = error_of(write(tmp_path, text))
    assert "data.task_params" in msg and "embed_dimm" in msg and "run.yaml:8" in msg


def test_the_batch_split_over_processes_is_checked_with_the_world_size() -> None:
    cfg = config_from_dict(
        {
            "policy": {"preset": {}},
            "data": {"task": "positional"},
            "rollout": {"prompts_per_step": 6, "group_size": 4},
            "algorithm": {"updates_per_epoch": 3},
        }
    )
    check_batch_split(cfg, 1)
    check_batch_split(cfg, 2)  # 3 prompts x 4 responses per rank, 3 updates of 4
    with pytest.raises(ConfigError, match=r"prompts_per_step=6 must be a multiple .* \(4\)"):
        check_batch_split(cfg, 4)
    with pytest.raises(ConfigError, match=r"updates_per_epoch=3 must divide .* \(4 = "):
        check_batch_split(cfg, 6)


def test_cuda_is_checked_against_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    check_device("cpu")
    check_device("auto")
    with pytest.raises(ConfigError, match=r"device: 'cuda' was requested .* use device=cpu"):
        check_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    check_device("cuda")
