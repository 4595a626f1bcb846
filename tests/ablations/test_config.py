"""The ablation config: what it accepts, what it rejects (naming the key), how runs are laid
out, and how a run's trainer config is assembled."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ablations.ablation_config import AblateConfig, deep_merge, load_ablate_config
from ablations.head_to_head import read_strongest
from ablations.results import RunKey, parse_shard, shard_runs
from ablations.runner import plan_runs, run_fingerprint, run_train_config
from ablations.settings import SettingAssets
from backends.common.errors import ConfigError
from tests.helpers.paths import REPO as ROOT

QUICK = ROOT / "configs" / "ablate" / "quick.yaml"
FULL = ROOT / "configs" / "ablate" / "full.yaml"


def _write(tmp_path: Path, data: dict[str, object]) -> Path:
    path = tmp_path / "ablate.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


BASE: dict[str, object] = {"strategies": ["uniform", "datc"], "settings": ["target_tokens"]}


def test_shipped_configs_load_and_have_the_promised_shape() -> None:
    quick = load_ablate_config(QUICK)
    originals = ["target_tokens", "minilm_shared", "minilm_bridge", "verifiable"]
    # the sparse setting where the full report found DATC's gain, one dense setting (a tie)
    assert list(quick.settings) == ["positional_sparse", "target_tokens"]
    labels = ["uniform", "datc", "datc_mid", "entropy_top", "red"]
    assert [s.label for s in quick.strategies] == labels
    assert quick.families == ["llama", "gpt2"] and quick.seeds == [0, 1, 2, 3]
    pairs = len(quick.families) * len(quick.seeds)
    assert pairs >= quick.report.min_pairs  # every setting gets a verdict
    assert len(plan_runs(quick)) == pairs * (5 + 3)
    assert quick.report.contenders == ["datc", "datc_mid"]
    assert quick.report.published == ["entropy_top", "red"]
    # the full report's strongest baseline of each quick setting runs there (#32)
    assert quick.report.reference is not None
    strongest = read_strongest(ROOT / quick.report.reference)
    for setting in quick.settings:
        ran = [s.label for s in quick.strategies if s.settings is None or setting in s.settings]
        assert strongest[setting] in ran
    full = load_ablate_config(FULL)
    assert list(full.settings) == [*originals, "positional_sparse", "keyword_sparse"]
    mid = full.strategy("datc_mid")
    assert mid.credit.name == "datc_mid"
    assert mid.settings is not None and "minilm_bridge" not in mid.settings
    assert {s.credit.name for s in full.strategies} == {
        "uniform",
        "datc",
        "datc_mid",
        "datc_unsigned",
        "datc_nosign",
        "datc_shuffled",
        "datc_inverse",
        "saliency",
        "entropy_top",
        "random_top",
        "abc",
        "red",
    }
    abc = full.strategy("abc")  # setting 5's reward model is a module without attention
    assert abc.settings is not None and "positional_sparse" not in abc.settings
    assert full.report.contenders == ["datc", "datc_mid"]
    assert full.report.published == ["entropy_top", "random_top", "abc", "red"]
    assert full.families == ["llama", "gpt2"] and len(full.seeds) >= 4
    assert len(plan_runs(full)) == (6 * 10 + 5 + 5) * 2 * len(full.seeds)


def test_strategy_label_and_settings(tmp_path: Path) -> None:
    cfg = AblateConfig.model_validate(
        {
            **BASE,
            "settings": ["target_tokens", "minilm_bridge"],
            "strategies": [
                "uniform",
                "datc",
                {"label": "mid", "name": "datc_mid", "settings": ["target_tokens"]},
            ],
        }
    )
    assert [r.strategy for r in plan_runs(cfg) if r.setting == "minilm_bridge"].count("mid") == 0
    assert len(plan_runs(cfg)) == (3 + 2) * 2
    assets = SettingAssets(
        policy_dir=tmp_path,
        data={},
        reward={"direction_model": {"kind": "module", "factory": "x:y"}},
    )
    out = run_train_config(cfg, RunKey("target_tokens", "llama", "mid", 0), assets, tmp_path)
    assert out["credit"] == {"name": "datc_mid"} and out["reward"] == assets.reward
    assert run_fingerprint(cfg, RunKey("target_tokens", "llama", "mid", 0)) != run_fingerprint(
        cfg, RunKey("target_tokens", "llama", "datc", 0)
    )
    again = AblateConfig.model_validate(cfg.to_yaml_dict())
    assert again == cfg
    with pytest.raises(ValueError, match="names settings"):
        AblateConfig.model_validate(
            {
                **BASE,
                "strategies": [
                    "uniform",
                    "datc",
                    {"name": "datc", "label": "m", "settings": ["verifiable"]},
                ],
            }
        )
    with pytest.raises(ValueError, match="run in every setting"):
        AblateConfig.model_validate(
            {**BASE, "strategies": ["uniform", {"name": "datc", "settings": ["target_tokens"]}]}
        )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"strategy": ["uniform"]}, r"strategy: Extra inputs are not permitted"),
        ({"settings": ["target_tokens", "chess"]}, r"unknown settings \['chess'\]"),
        ({"strategies": ["uniform", "datc", "datc"]}, r"duplicate labels \['datc'\]"),
        ({"strategies": ["datc"]}, r"baseline: 'uniform' is not one of the strategies"),
        ({"strategies": ["uniform", "nope"]}, r"nope"),
        ({"train": {"seed": 3}}, r"train: \['seed'\] are set by the runner"),
        ({"seeds": [0, 0]}, r"seeds and families must not repeat"),
        ({"families": ["mamba"]}, r"families\.0"),
        (
            {"settings": {"target_tokens": {"params": {"num_trian": 4}}}},
            r"settings\.target_tokens\.params\.num_trian: Extra inputs are not permitted",
        ),
        ({"train": {"rollout": {"gruop_size": 4}}}, r"rollout\.gruop_size: unknown key"),
        ({"train": {"rollout": {"group_size": 1}}}, r"rollout\.group_size: must be >= 2"),
    ],
)
def test_bad_configs_are_rejected_naming_the_key(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_ablate_config(_write(tmp_path, {**BASE, **change}))


def test_set_overrides_and_short_forms(tmp_path: Path) -> None:
    cfg = load_ablate_config(
        _write(tmp_path, BASE),
        [
            "seeds=[3, 4, 5]",
            "strategies=[uniform, {name: datc, beta: 2.0, label: hot}]",
            "train.steps=7",
        ],
    )
    assert cfg.seeds == [3, 4, 5]
    hot = cfg.strategy("hot")
    assert hot.credit.name == "datc" and hot.credit.params == {"beta": 2.0}
    assert cfg.train == {"steps": 7}
    assert list(cfg.settings) == ["target_tokens"] and cfg.settings["target_tokens"].params == {}
    with pytest.raises(ConfigError, match="config file not found"):
        load_ablate_config(tmp_path / "missing.yaml")


def test_yaml_round_trip(tmp_path: Path) -> None:
    cfg = load_ablate_config(QUICK)
    again = load_ablate_config(_write(tmp_path, cfg.to_yaml_dict()))
    assert again == cfg


def test_plan_order_and_round_robin_shards() -> None:
    cfg = AblateConfig.model_validate(
        {**BASE, "settings": ["target_tokens", "verifiable"], "families": ["llama", "gpt2"]}
    )
    plan = plan_runs(cfg)
    assert plan[:3] == [
        RunKey("target_tokens", "llama", "uniform", 0),
        RunKey("target_tokens", "llama", "uniform", 1),
        RunKey("target_tokens", "llama", "datc", 0),
    ]
    parts = [shard_runs(plan, i, 3) for i in range(3)]
    assert sorted(r for p in parts for r in p) == sorted(plan)
    assert {len(p) for p in parts} == {5, 6}
    assert parse_shard("1/3") == (1, 3)
    for bad in ("3/3", "1", "a/b", "-1/2", "0/0"):
        with pytest.raises(ValueError, match="--shard"):
            parse_shard(bad)


def test_run_train_config_layers_shared_setting_and_run_fields(tmp_path: Path) -> None:
    cfg = AblateConfig.model_validate(
        {
            **BASE,
            "train": {"steps": 5, "rollout": {"group_size": 4, "max_new_tokens": 30}},
            "settings": {"target_tokens": {"train": {"optim": {"lr": 0.01}}}},
        }
    )
    assets = SettingAssets(
        policy_dir=tmp_path / "policy",
        data={"train_file": "t.jsonl", "eval_file": "e.jsonl"},
        reward={"direction_model": {"kind": "seq_classification", "path": "rm"}},
        train={"rollout": {"max_new_tokens": 9}},
    )
    run = RunKey("target_tokens", "llama", "datc", 3)
    out = run_train_config(cfg, run, assets, tmp_path / "run")
    assert out["seed"] == 3 and out["steps"] == 5
    assert out["credit"] == {"name": "datc"}
    assert out["rollout"] == {"group_size": 4, "max_new_tokens": 9}  # the setting's default wins
    assert out["optim"] == {"lr": 0.01}
    assert out["policy"]["path"] == str(tmp_path / "policy")
    assert out["policy"]["tokenizer"] == str(tmp_path / "policy" / "tokenizer")
    assert out["output_dir"] == str(tmp_path / "run" / "train")
    assert out["reward"] == assets.reward and out["data"] == assets.data


def test_deep_merge_merges_mappings_and_replaces_the_rest() -> None:
    base = {"a": {"b": 1, "c": [1]}, "d": 1}
    assert deep_merge(base, {"a": {"c": [2]}, "e": 3}) == {"a": {"b": 1, "c": [2]}, "d": 1, "e": 3}
    assert base == {"a": {"b": 1, "c": [1]}, "d": 1}


PPO_GAE = {"label": "ppo_gae", "name": "uniform", "train": {"algorithm": {"estimator": "gae"}}}


def test_a_ppo_gae_row_trains_with_a_critic_at_the_same_rollout_budget(tmp_path: Path) -> None:
    data = {
        **BASE,
        "strategies": ["uniform", "datc", PPO_GAE],
        "train": {"rollout": {"group_size": 8, "prompts_per_step": 4}},
        "settings": {"target_tokens": {"train": {"optim": {"lr": 0.01}}}},
    }
    cfg = load_ablate_config(_write(tmp_path, data))
    assert [r.strategy for r in plan_runs(cfg)].count("ppo_gae") == 2
    assets = SettingAssets(policy_dir=tmp_path, data={}, reward={})
    runs = {
        label: run_train_config(cfg, RunKey("target_tokens", "llama", label, 0), assets, tmp_path)
        for label in ("uniform", "ppo_gae")
    }
    ppo, grpo = runs["ppo_gae"], runs["uniform"]
    assert ppo["credit"] == {"name": "uniform"} and ppo["algorithm"] == {"estimator": "gae"}
    assert ppo["rollout"] == grpo["rollout"] == {"group_size": 8, "prompts_per_step": 4}
    assert ppo["optim"] == grpo["optim"] == {"lr": 0.01}

    # the row's overrides are part of its runs' identity; rows without them keep theirs
    def key(label: str) -> RunKey:
        return RunKey("target_tokens", "llama", label, 0)

    assert run_fingerprint(cfg, key("ppo_gae")) != run_fingerprint(cfg, key("uniform"))
    plain = load_ablate_config(_write(tmp_path, {**data, "strategies": ["uniform", "datc"]}))
    for label in ("uniform", "datc"):
        assert run_fingerprint(cfg, key(label)) == run_fingerprint(plain, key(label))
    assert load_ablate_config(_write(tmp_path, cfg.to_yaml_dict())) == cfg


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (
            {**PPO_GAE, "name": "ktae"},
            r"(?s)strategies\.ppo_gae\.train\).*'ktae' has no token-reward form for a critic",
        ),
        ({**PPO_GAE, "train": {"seed": 1}}, r"strategies\.ppo_gae\.train: \['seed'\] are set"),
    ],
)
def test_a_rows_trainer_overrides_are_checked_with_its_credit(
    tmp_path: Path, row: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_ablate_config(_write(tmp_path, {**BASE, "strategies": ["uniform", "datc", row]}))


def test_a_row_with_trainer_overrides_cannot_be_a_compared_credit(tmp_path: Path) -> None:
    data = {**BASE, "strategies": ["uniform", "datc", PPO_GAE], "probes": {"compare": ["ppo_gae"]}}
    with pytest.raises(ConfigError, match=r"probes\.compare: \['ppo_gae'\] have their own"):
        load_ablate_config(_write(tmp_path, data))


def test_the_primary_metric_is_named_per_setting_and_must_be_one_it_records(
    tmp_path: Path,
) -> None:
    from ablations.runner import summary_spec

    cfg = load_ablate_config(
        _write(
            tmp_path,
            {**BASE, "settings": {"target_tokens": {"primary": "extra_task_score_greedy"}}},
        )
    )
    (setting,) = summary_spec(cfg).settings
    assert setting.primary == "extra_task_score_greedy"
    assert setting.metric_label == "task score (greedy)"
    default = load_ablate_config(_write(tmp_path, BASE))
    (setting,) = summary_spec(default).settings
    assert setting.primary == "extra_task_score_sampled"
    assert setting.metric_label == "task score (exact rule)"
    # the shipped configs name every setting's primary metric before the runs
    for path in (QUICK, FULL):
        shipped = load_ablate_config(path)
        assert all(s.primary is not None for s in shipped.settings.values())
    with pytest.raises(
        ConfigError,
        match=r"settings\.verifiable\.primary: 'extra_task_score_sampled' is not a held-out "
        r"metric setting 'verifiable' records; expected one of \['eval_reward_greedy', "
        r"'eval_reward_sampled'\]",
    ):
        load_ablate_config(
            _write(
                tmp_path,
                {**BASE, "settings": {"verifiable": {"primary": "extra_task_score_sampled"}}},
            )
        )
    with pytest.raises(ConfigError, match=r"settings\.target_tokens\.primary: 'eval_reward_"):
        load_ablate_config(
            _write(
                tmp_path,
                {
                    **BASE,
                    "train": {"eval": {"greedy": False}},
                    "settings": {"target_tokens": {"primary": "eval_reward_greedy"}},
                },
            )
        )


def test_model_seeds_set_the_pretraining_and_reward_model_seeds_of_a_run(tmp_path: Path) -> None:
    from ablations.runner import asset_key
    from ablations.settings import MODEL_SEED_STRIDE

    off = load_ablate_config(_write(tmp_path, BASE))
    on = load_ablate_config(_write(tmp_path, {**BASE, "model_seeds": True}))
    assert off.model_seeds is False
    runs = [RunKey("target_tokens", "llama", "datc", s) for s in (0, 2)]
    # off: one policy and RM per (setting, family), whatever the seed
    assert off.setting_params("target_tokens", 2) == off.setting_params("target_tokens", 0)
    assert asset_key(off, runs[0]) == asset_key(off, runs[1]) == ("target_tokens", "llama", None)
    # on: seed 0 keeps the configured models, seed 2 offsets both seeds
    assert on.setting_params("target_tokens", 0) == on.setting_params("target_tokens")
    two = on.setting_params("target_tokens", 2)
    assert two.pretrain.seed == 2 * MODEL_SEED_STRIDE and two.rm.seed == 2 * MODEL_SEED_STRIDE
    assert two.seed == 0  # the task data stays the task's
    assert asset_key(on, runs[1]) == ("target_tokens", "llama", 2)
    # the fingerprint of a seeded run changes only where its models do
    assert run_fingerprint(on, runs[0]) == run_fingerprint(off, runs[0])
    assert run_fingerprint(on, runs[1]) != run_fingerprint(off, runs[1])


#: A config with GRPO at two learning rates and a matched-allocation row.
FAMILY_BASE: dict[str, object] = {
    **BASE,
    "strategies": [
        "uniform",
        {"label": "uniform_lr1e-3", "name": "uniform", "train": {"optim": {"lr": 1e-3}}},
        "datc",
        "p2t",
        {"label": "mid", "name": "datc_mid", "settings": ["target_tokens"]},
    ],
}


def test_a_primary_family_is_declared_in_the_report_section(tmp_path: Path) -> None:
    from ablations.runner import summary_spec
    from ablations.summary import PrimaryFamily

    family = {
        "against_baseline": ["datc", "p2t"],
        "pairs": [["mid", "p2t"]],
        "baseline_best_of": ["uniform", "uniform_lr1e-3"],
    }
    cfg = load_ablate_config(
        _write(tmp_path, {**FAMILY_BASE, "report": {"primary_family": family}})
    )
    assert summary_spec(cfg).primary_family == PrimaryFamily(
        ("datc", "p2t"), (("mid", "p2t"),), ("uniform", "uniform_lr1e-3")
    )
    assert AblateConfig.model_validate(cfg.to_yaml_dict()) == cfg
    # none declared: every verdict is the setting's Holm-corrected t-test, as before
    assert summary_spec(load_ablate_config(_write(tmp_path, FAMILY_BASE))).primary_family is None


@pytest.mark.parametrize(
    ("family", "message"),
    [
        ({}, r"report\.primary_family: declare at least one contrast"),
        (
            {"against_baseline": ["datc", "dtac"]},
            r"report\.primary_family\.against_baseline: \['dtac'\] are not labels",
        ),
        (
            {"pairs": [["mid", "p2t_matched"]]},
            r"report\.primary_family\.pairs\.0: \['p2t_matched'\]",
        ),
        (
            {"pairs": [["datc", "p2t"], ["p2t", "datc"]]},
            r"primary_family\.pairs\.1: .*each pair once",
        ),
        ({"pairs": [["datc", "datc"]]}, r"primary_family\.pairs\.0: .*two different labels"),
        ({"pairs": [["datc"]]}, r"primary_family\.pairs\.0"),
        ({"against_baseline": ["datc", "datc"]}, r"against_baseline: \['datc'\] are named twice"),
        ({"against_baseline": ["uniform"]}, r"against_baseline: \['uniform'\] are GRPO's row"),
        (
            {"against_baseline": ["datc"], "baseline_best_of": ["uniform"]},
            r"baseline_best_of: expected two or more distinct labels",
        ),
        (
            {"against_baseline": ["datc"], "baseline_best_of": ["uniform", "mid"]},
            r"baseline_best_of: \['mid'\] run only in some settings",
        ),
        (
            {"against_baseline": ["datc"], "baseline_best_of": ["uniform", "uniform_lr3"]},
            r"baseline_best_of: \['uniform_lr3'\] are not labels",
        ),
        ({"against_baseline": ["datc"], "surprise": 1}, r"primary_family\.surprise"),
    ],
)
def test_a_bad_primary_family_is_refused_at_load_naming_the_field(
    tmp_path: Path, family: dict[str, object], message: str
) -> None:
    """Before any run: an unknown label, a pair declared twice or of one label, a GRPO
    candidate that does not run everywhere, a contender that is GRPO's row."""
    with pytest.raises(ConfigError, match=message):
        load_ablate_config(_write(tmp_path, {**FAMILY_BASE, "report": {"primary_family": family}}))


def test_a_pair_that_no_setting_runs_both_of_is_refused(tmp_path: Path) -> None:
    data = {
        **FAMILY_BASE,
        "settings": ["target_tokens", "minilm_bridge"],
        "strategies": [
            "uniform",
            "datc",
            {"label": "mid", "name": "datc_mid", "settings": ["target_tokens"]},
            {"label": "p2t_b", "name": "p2t", "settings": ["minilm_bridge"]},
        ],
        "report": {"primary_family": {"pairs": [["mid", "p2t_b"]]}},
    }
    with pytest.raises(ConfigError, match=r"pairs\.0: \[mid, p2t_b\]: no setting runs both"):
        load_ablate_config(_write(tmp_path, data))


@pytest.mark.parametrize(
    "name", sorted(p.name for p in (ROOT / "configs" / "ablate").glob("*.yaml"))
)
def test_a_worker_s_config_plans_the_runs_of_its_runner(name: str, tmp_path: Path) -> None:
    """``run_workers`` hands each worker ``to_yaml_dict``'s config: read back, every run has
    the runner's fingerprint (a dropped key, e.g. a strategy's ``gate``, would train another
    run under the label and be taken for stale)."""
    cfg = load_ablate_config(ROOT / "configs" / "ablate" / name)
    again = load_ablate_config(_write(tmp_path, cfg.to_yaml_dict()))
    assert again == cfg
    runs = plan_runs(cfg)
    assert [run_fingerprint(again, r) for r in runs] == [run_fingerprint(cfg, r) for r in runs]
