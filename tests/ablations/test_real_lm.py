"""Setting 10 (``real_lm``, ablations/real_lm.py): the outcome RM's input layout is
``ModuleRM``'s, its saved form is a ``module`` direction model, the frozen lower stack leaves
only the top blocks and the head to train, the label is read off the prompt, config errors
name their field; and, on SmolLM2 itself (one GGUF load for the module), the setting builds
with its RM's fit on fresh samples, and the runner trains uniform and datc through it with
the lower stack unchanged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from ablations import real_lm
from ablations.ablation_config import AblateConfig
from ablations.settings import SETTINGS, SettingAssets, seeded
from adapters.config import build_direction_model
from adapters.reward_models import ModuleRM
from adapters.tiny import tiny_causal_lm

pytestmark = pytest.mark.usefixtures("single_torch_thread")

V = 50


def _batch(seed: int) -> tuple[torch.Tensor, ...]:
    """Left-padded prompts and right-padded responses of uneven lengths (the trainer's)."""
    gen = torch.Generator().manual_seed(seed)
    B, P, R = 4, 5, 6
    prompt = torch.randint(1, V, (B, P), generator=gen)
    response = torch.randint(1, V, (B, R), generator=gen)
    p_len, r_len = torch.tensor([5, 3, 1, 4]), torch.tensor([6, 2, 4, 1])
    p_mask = (torch.arange(P) >= P - p_len.unsqueeze(1)).long()
    r_mask = (torch.arange(R) < r_len.unsqueeze(1)).long()
    return prompt * p_mask, p_mask, response * r_mask, r_mask


def test_pack_is_the_layout_module_rm_scores() -> None:
    torch.manual_seed(0)
    module = real_lm.OutcomeRM(16, 1, 2).eval()
    table = torch.randn(V, 16)
    prompt, p_mask, response, r_mask = _batch(1)
    rm = ModuleRM(module, table, policy_vocab_size=V, include_prompt=True)
    scored = rm.score(prompt, p_mask, response, r_mask, with_grad=False).rewards
    ids, mask = real_lm.pack(prompt, p_mask, response, r_mask)
    assert mask.sum(1).tolist() == (p_mask.sum(1) + r_mask.sum(1)).tolist()
    with torch.no_grad():
        mine = module(table[ids], mask)
    torch.testing.assert_close(scored, mine, rtol=1e-5, atol=1e-5)
    # padding never changes a row's score
    wide_ids = torch.nn.functional.pad(ids, (0, 3))
    with torch.no_grad():
        wide = module(table[wide_ids], torch.nn.functional.pad(mask, (0, 3)))
    torch.testing.assert_close(wide, mine, rtol=1e-5, atol=1e-5)


def test_the_saved_rm_is_a_module_direction_model(tmp_path: Path) -> None:
    torch.manual_seed(0)
    module = real_lm.OutcomeRM(8, 1, 2).eval()
    table = torch.randn(V, 8)
    cfg = {"hidden": 8, "layers": 1, "heads": 2}
    state = {"config": cfg, "module": module.state_dict(), "table": table}
    torch.save(state, tmp_path / real_lm.RM_FILE)
    spec = {
        "kind": "module",
        "factory": "ablations.real_lm:outcome_rm",
        "factory_kwargs": {"path": str(tmp_path)},
        "include_prompt": True,
    }
    dm = build_direction_model(spec, None, policy_vocab_size=V)
    prompt, p_mask, response, r_mask = _batch(2)
    out = dm.score(prompt, p_mask, response, r_mask, with_grad=True)
    ids, mask = real_lm.pack(prompt, p_mask, response, r_mask)
    with torch.no_grad():
        torch.testing.assert_close(out.rewards, module(table[ids], mask), rtol=1e-5, atol=1e-5)
    assert out.reward_grad is not None and out.reward_grad.shape == (4, 6, 8)


def test_freeze_lower_stack_leaves_the_top_blocks_norm_and_head() -> None:
    model = tiny_causal_lm("llama", V, layers=3, hidden=16, heads=2)
    real_lm.freeze_lower_stack(model, 1)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable, "nothing trains"
    assert all(
        n.startswith(("model.layers.2.", "model.norm.", "lm_head.", "model.embed_tokens."))
        for n in trainable
    ), trainable
    assert any(n.startswith("model.layers.2.") for n in trainable)
    assert not any(n.startswith(("model.layers.0.", "model.layers.1.")) for n in trainable)
    real_lm.freeze_lower_stack(model, 0)
    assert not any(p.requires_grad for n, p in model.named_parameters() if ".layers." in n)
    with pytest.raises(ValueError, match=r"trainable_blocks: 4 exceeds the model's 3 blocks"):
        real_lm.freeze_lower_stack(model, 4)
    with pytest.raises(ValueError, match="trainable_blocks: expected a decoder"):
        real_lm.freeze_lower_stack(torch.nn.Linear(2, 2), 1)


def test_the_label_is_read_off_the_prompt() -> None:
    chat = (
        "system\nYou are a helpful AI assistant\nuser\nWhat is 7 + 5? Answer with the number only."
    )
    assert real_lm.question_sum(chat) == 12
    assert real_lm.truth([chat, chat, chat], ["7 + 5 = 12.", "12", "13 or 11"]) == [1.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="no 'What is a \\+ b\\?' question"):
        real_lm.question_sum("What is the capital of France?")


def _config(**params: Any) -> dict[str, Any]:
    return {
        "name": "t",
        "families": ["llama"],
        "seeds": [0, 1],
        "model_seeds": True,
        "strategies": ["uniform", {"name": "datc", "beta": 0.5, "lam": 0.5}],
        "settings": {"real_lm": {"params": params}},
    }


def test_config_errors_name_the_field() -> None:
    cfg = AblateConfig.model_validate(_config(response_len=32))
    assert cfg.setting_kind("real_lm") is SETTINGS["real_lm"]
    assert cfg.setting_params("real_lm", 1).rm.seed == 1000  # model seeds = RM seeds
    assert cfg.setting_title("real_lm").startswith("10. SmolLM2-135M-Instruct")
    with pytest.raises(ValueError, match="response_len"):
        AblateConfig.model_validate(_config(response_len=0))
    with pytest.raises(ValueError, match=r"rm.hidden \(30\) must be a multiple of rm.heads"):
        AblateConfig.model_validate(_config(rm={"hidden": 30, "heads": 4}))
    with pytest.raises(ValueError, match="no_such_package"):
        AblateConfig.model_validate(_config(gguf={"package": "no_such_package", "file": "x.gguf"}))
    with pytest.raises(ValueError, match="num_eval_prompts"):
        AblateConfig.model_validate(_config(task={"num_eval_prompts": 99}))
    with pytest.raises(ValueError, match=r"families: .*'real_lm' trains SmolLM2, a llama model"):
        SETTINGS["real_lm"].build(real_lm.RealLMParams(), "gpt2", Path("/nonexistent"))


# ---- on SmolLM2 itself: one GGUF load, one cache for the module -------------------------

SMALL = {
    "response_len": 8,
    "trainable_blocks": 1,
    "fit_samples_per_prompt": 2,
    "task": {"num_prompts": 4, "num_eval_prompts": 2},
    "rm": {"samples_per_prompt": 2, "steps": 3, "batch_size": 4, "hidden": 8, "heads": 2},
}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, SettingAssets]:
    pytest.importorskip("gguf")
    cache = tmp_path_factory.mktemp("real_lm_cache")
    params = seeded(real_lm.RealLMParams.model_validate(SMALL), 0)
    return cache, SETTINGS["real_lm"].build(params, "llama", cache)


@pytest.mark.slow
def test_the_setting_builds_with_its_rm_fit_on_fresh_samples(
    built: tuple[Path, SettingAssets],
) -> None:
    _, assets = built
    assert assets.data["chat_template"] is True
    assert assets.reward["reward"]["function"] == "backends.common.arithmetic:exact_answer"
    assert assets.train == {"rollout": {"max_new_tokens": 8}}
    fit, fresh = assets.info["rm_fit"], assets.info["policy_samples"]
    assert fit["train_samples"] == 6 and fit["val_samples"] == 2  # 3 + 1 prompts x 2
    assert 0.0 <= fit["val_accuracy"] <= 1.0
    assert fresh["samples"] == 4  # 2 held-out prompts x 2, not the RM's training draws
    assert 0.0 <= fresh["exact_mean"] <= 1.0
    assert (
        0.0
        < fresh["entropy"]
        < fresh["log_vocab"]
        == pytest.approx(torch.log(torch.tensor(49152.0)).item())
    )
    assert set(fresh) >= {"rm_corr", "rm_pair_accuracy"}


@pytest.fixture(scope="module")
def plan(
    built: tuple[Path, SettingAssets], tmp_path_factory: pytest.TempPathFactory
) -> tuple[AblateConfig, dict[str, dict[str, Any]]]:
    """A two-run plan (uniform and datc, model seed 0, one step, evaluated at steps 0 and 1)
    trained by the runner's own ``execute_run`` into the config's output folder."""
    from ablations.results import RunKey
    from ablations.runner import execute_run

    cache, assets = built
    out = tmp_path_factory.mktemp("real_lm_plan")
    doc = _config(**SMALL)
    doc.update(
        cache_dir=str(cache),
        output_dir=str(out),
        seeds=[0],
        probes={"enabled": False},
        train={
            "steps": 1,
            "rollout": {"group_size": 4, "prompts_per_step": 1, "top_k": 0, "top_p": 1.0},
            "eval": {"interval": 1, "greedy": False},
        },
    )
    cfg = AblateConfig.model_validate(doc)
    results = {
        name: execute_run(cfg, RunKey("real_lm", "llama", name, 0), assets, out, heatmap=False)
        for name in ("uniform", "datc")
    }
    return cfg, results


@pytest.mark.slow
def test_the_runner_trains_uniform_and_datc_with_the_lower_stack_frozen(
    built: tuple[Path, SettingAssets],
    plan: tuple[AblateConfig, dict[str, dict[str, Any]]],
    tmp_path: Path,
) -> None:
    from ablations.results import RunKey
    from ablations.runner import run_train_config
    from backends.torch.trainer import GRPORecipe, resolve_config

    _, assets = built
    cfg, results = plan
    for result in results.values():
        assert result["info"]["policy_samples"] == assets.info["policy_samples"]
        assert len(result["history"]) >= 1

    run = RunKey("real_lm", "llama", "datc", 0)
    recipe = GRPORecipe(resolve_config(run_train_config(cfg, run, assets, tmp_path / "datc")))
    try:
        assert assets.prepare_policy is not None
        assets.prepare_policy(recipe.policy.model)
        before = {n: p.detach().clone() for n, p in recipe.policy.model.named_parameters()}
        metrics = recipe.train_step()
        assert metrics
        after = dict(recipe.policy.model.named_parameters())
        last = len(recipe.policy.model.model.layers) - 1
        moved = {n for n in before if not torch.equal(before[n], after[n].detach())}
        assert any(n.startswith(f"model.layers.{last}.") for n in moved), sorted(moved)
        assert not any(n.startswith("model.layers.0.") for n in moved)
        assert all(
            n.startswith(
                (f"model.layers.{last}.", "model.norm.", "lm_head.", "model.embed_tokens.")
            )
            for n in moved
        ), sorted(moved)
    finally:
        recipe.close()


def test_the_report_of_a_real_lm_plan_names_the_outcome_rms_fit(
    built: tuple[Path, SettingAssets], plan: tuple[AblateConfig, dict[str, dict[str, Any]]]
) -> None:
    from ablations.runner import write_outputs

    _, assets = built
    cfg, _ = plan
    report = write_outputs(cfg, command="test").report.read_text()
    fit = assets.info["rm_fit"]
    line = next(x for x in report.splitlines() if "outcome RM fit" in x)
    assert f"{fit['val_accuracy']:.3f} / {fit['val_auc']:.3f}" in line


def test_a_model_fit_of_no_known_kind_is_named_not_dropped(
    plan: tuple[AblateConfig, dict[str, dict[str, Any]]], tmp_path: Path
) -> None:
    import json
    import shutil

    from ablations.runner import write_outputs
    from backends.common.errors import ConfigError

    cfg, _ = plan
    out = tmp_path / "out"
    shutil.copytree(cfg.output_dir, out)
    for path in out.rglob("result.json"):  # both runs alike: still one build
        result = json.loads(path.read_text())
        result["info"]["rm_fit"] = {"val_f1": 0.5}
        path.write_text(json.dumps(result))
    changed = cfg.model_copy(update={"output_dir": str(out)})
    with pytest.raises(ConfigError, match=r"info\.rm_fit has keys \['val_f1'\]; expected one of"):
        write_outputs(changed, command="test")


def test_the_shipped_config_declares_the_primary_family_and_the_gated_row() -> None:
    from ablations.ablation_config import load_ablate_config
    from ablations.runner import plan_runs

    cfg = load_ablate_config(Path(__file__).parents[2] / "configs/ablate/real_lm.yaml")
    assert cfg.families == ["llama"] and len(cfg.seeds) >= 8 and cfg.model_seeds
    family = cfg.report.primary_family
    assert family is not None
    assert set(family.against_baseline) == {
        "datc",
        "datc_mid",
        "p2t_matched",
        "entropy_top",
        "random_top",
    }
    assert [tuple(p) for p in family.pairs] == [("datc_mid", "p2t_matched")]
    grid = family.baseline_best_of  # GRPO at every rate of the pilot's grid
    assert len(grid) == 4 and {cfg.strategy(g).credit.name for g in grid} == {"uniform"}
    matched = cfg.strategy("p2t_matched").credit.model_dump()
    datc = cfg.strategy("datc").credit.model_dump()
    assert matched["allocation"] == "softmax_floor"
    assert (matched["beta"], matched["lam"]) == (datc["beta"], datc["lam"])
    # secondary: DATC under the recommended gate, gate_attribution.yaml's setting unchanged
    gated = cfg.strategy("datc_attr_gated").credit
    recommended = load_ablate_config(
        Path(__file__).parents[2] / "configs/ablate/gate_attribution.yaml"
    ).strategy("datc_attr_gated")
    assert gated.gate is not None and gated.gate == recommended.credit.gate
    assert gated.gate.measure == "attribution"
    assert len(plan_runs(cfg)) == (len(grid) + 6) * len(cfg.seeds)
