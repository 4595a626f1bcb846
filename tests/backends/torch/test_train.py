"""End-to-end runs of the native trainer on the tiny preset and the built-in task."""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from safetensors.torch import load_file

from adapters.direction import EmbeddingDirectionModel
from adapters.grad_path import (
    HandedExpectedEmbeddings,
    PathGradientDirection,
    path_alphas,
    path_reward_grad,
)
from adapters.policy import response_logprobs_and_stats, response_logprobs_and_work
from backends.common.errors import ConfigError
from backends.common.jsonl import read_jsonl
from backends.torch.checkpoint import checkpoint_folders
from backends.torch.config import config_from_dict, load_config
from backends.torch.critic import response_values
from backends.torch.gae import gae_advantages_and_returns, outcome_token_rewards, whiten
from backends.torch.loss import aggregate, ppo_clip_loss
from backends.torch.trainer import GRPORecipe, RunResult, train
from credit_core import (
    CreditConfig,
    CreditStrategy,
    ScoreStrategy,
    get_strategy,
    group_advantages,
    token_work,
)
from credit_core.builtin_strategies import BUILTIN_STRATEGIES
from credit_core.token_rewards import critic_reward_shift
from tests.helpers.one_rank import join_one_rank_group
from tests.helpers.paths import REPO
from tests.helpers.torch_tiny import (
    build_policy_with_frequent_eos,
    comparable,
    crash_in_step_3,
    tiny_config,
)

pytestmark = pytest.mark.usefixtures("single_torch_thread")

TRAINER = "backends.torch.trainer"
CREDIT = "backends.torch.credit"
BUILTIN = [cls.name for cls in BUILTIN_STRATEGIES]


def steps_of(history: list[dict[str, Any]], key: str = "reward/mean") -> list[int]:
    return [int(r["step"]) for r in history if key in r]


# ------------------------------------------------------------------ every strategy runs


#: The built-in task's direction model is a module without attention: ``abc`` runs in
#: tests/backends/torch/test_baselines.py with a transformer reward model; ``process`` reads
#: the token rewards of a reward function (tests/backends/torch/test_token_rewards.py).
RUN_ON_TASK = [name for name in BUILTIN if name not in ("abc", "process")]
SCORE_BASED = {cls.name for cls in BUILTIN_STRATEGIES if issubclass(cls, ScoreStrategy)}


@pytest.mark.parametrize("strategy", RUN_ON_TASK)
def test_every_builtin_strategy_completes_three_steps_computing_only_what_it_needs(
    tmp_path: Path, strategy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cls = {cls.name: cls for cls in BUILTIN_STRATEGIES}[strategy]
    span = {"data": {"answer_span": {"last": 2}}} if cls.reads_answer_span else {}
    built: list[str] = []
    init = CreditStrategy.__init__

    def counted(self: CreditStrategy, *args: Any, **kwargs: Any) -> None:
        built.append(type(self).name)
        init(self, *args, **kwargs)

    monkeypatch.setattr(CreditStrategy, "__init__", counted)
    result = train(tiny_config(tmp_path / "run", credit=strategy, **span))
    assert steps_of(result.history) == [1, 2, 3]
    assert built == [strategy]  # one strategy instance in the process, config check included
    requires = cls.requires
    batch = 2 * 4  # prompts_per_step x group_size
    for record in result.history:
        assert all(math.isfinite(v) for v in record.values()), record
        # the reward gradient is taken for the strategies that read it or a signal made from
        # it in the same pass (P2T's attribution r_t = (e_t - e_null) . g_t)
        from_grad = {"reward_grad", "reward_attribution"}
        assert record["signals/reward_grad_rows"] == (batch if requires & from_grad else 0)
        assert record["signals/policy_stats_rows"] == (batch if "policy_stats" in requires else 0)
        if strategy in SCORE_BASED:
            assert record["credit/weight_min"] > 0  # lam < 1: every token keeps the sign of A


# ------------------------------------------- datc_mid, datc_ig: where the gradient is taken


@pytest.mark.parametrize(("credit", "points"), [("datc_mid", 1), ({"name": "datc_ig"}, 4)])
def test_a_path_gradient_strategy_takes_g_on_the_path_to_the_expected_embeddings(
    tmp_path: Path, credit: Any, points: int
) -> None:
    """docs/design.md, "Curvature-robust direction": rewards at the samples; g averaged over
    x(a) = E[y] + a (m1 - E[y]), a = (k + 1/2) / n, m1 the policy's expected embeddings at
    the rollout temperature; ``datc`` keeps the gradient at the samples."""
    cfg = tiny_config(tmp_path / "run", credit=credit, rollout={"temperature": 0.7})
    recipe = GRPORecipe(config_from_dict(cfg))
    try:
        prompts, positions, groups = recipe._my_prompts(
            recipe.sampler.next_batch(), recipe.train_prompts
        )
        batch = recipe.rollout(prompts, positions, groups, group_size=4, greedy=False, tag="t")
        direction = recipe.reward.direction
        assert isinstance(direction, PathGradientDirection)
        inner = direction.inner
        # the old-policy pass hands its m1 over (no forward of its own), then the rewards
        old = recipe.credit.old_policy_pass(
            recipe.model, batch, embedding=inner.reward_embedding, stats=True
        )
        assert isinstance(direction.expected, HandedExpectedEmbeddings)
        direction.expected.hand(old.expected)
        out = recipe.reward.compute(batch, with_grad=True, micro_batch_size=8)
        ids = torch.cat([batch.prompt_ids, batch.response_ids], dim=1)
        mask = torch.cat([batch.prompt_mask.long(), batch.response_mask.long()], dim=1)
        _, stats = response_logprobs_and_stats(
            recipe.policy.model,
            ids,
            mask,
            batch.response_len,
            temperature=0.7,
            reward_embedding=inner.reward_embedding,
        )
        assert stats is not None
        rollout = (batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask)
        expected = path_reward_grad(inner, *rollout, stats.m1, path_alphas(points))
        expected = torch.where(batch.response_mask.bool().unsqueeze(2), expected, 0.0)
        assert out.reward_grad is not None
        torch.testing.assert_close(out.reward_grad, expected, rtol=1e-5, atol=1e-6)
        plain = inner.score(*rollout, with_grad=True)
        torch.testing.assert_close(out.rewards, plain.rewards)
        assert not torch.allclose(out.reward_grad, plain.reward_grad)  # type: ignore[arg-type]
    finally:
        recipe.close()


def test_a_path_gradient_strategy_trains_under_fsdp_as_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """datc_mid reads no policy weight of its own (m1 comes from the old-policy pass): under
    FSDP2 (one rank, gloo: the wrap and the collectives take their multi-rank paths) a step
    gives the unwrapped run's loss, credit and weights."""
    updates = {**TWO_RANK_UPDATES, "credit": "datc_mid"}
    plain = train(tiny_config(tmp_path / "plain", **updates))
    join_one_rank_group(monkeypatch)
    sharded = train(tiny_config(tmp_path / "fsdp", distributed={"strategy": "fsdp"}, **updates))
    one, two = plain.history[-1], sharded.history[-1]
    for key in ("loss/policy", "reward/mean", "credit/weight_max", "credit/weight_entropy"):
        assert two[key] == pytest.approx(one[key], rel=1e-5, abs=1e-6), key
    assert one["credit/weight_max"] > 1.0  # the credit is not uniform
    assert_close_weights(
        final_weights_at(tmp_path / "plain", 1), final_weights_at(tmp_path / "fsdp", 1)
    )


# --------------------------------------------------- uniform: plain GRPO, nothing extra


def test_uniform_feeds_broadcast_response_advantages_and_computes_no_signals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, list[Any]] = {"adv": [], "ppo": [], "agg": [], "grad": [], "emb": []}
    real_adv, real_ppo, real_agg, real_lp = (
        group_advantages,
        ppo_clip_loss,
        aggregate,
        response_logprobs_and_stats,
    )
    real_score = EmbeddingDirectionModel.score

    def spy_adv(*a: Any, **k: Any) -> torch.Tensor:
        out = real_adv(*a, **k)
        seen["adv"].append(out)
        return out

    def spy_ppo(log_probs: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, **k: Any) -> Any:
        seen["ppo"].append(adv.clone())
        return real_ppo(log_probs, old, adv, **k)

    def spy_agg(values: torch.Tensor, mask: torch.Tensor, *a: Any) -> torch.Tensor:
        seen["agg"].append(mask.clone())
        return real_agg(values, mask, *a)

    def spy_lp(*a: Any, **k: Any) -> Any:
        seen["emb"].append(k.get("reward_embedding"))
        return real_lp(*a, **k)

    def spy_score(self: Any, *a: Any, **k: Any) -> Any:
        seen["grad"].append(k["with_grad"])
        return real_score(self, *a, **k)

    monkeypatch.setattr(f"{CREDIT}.group_advantages", spy_adv)
    monkeypatch.setattr(f"{TRAINER}.ppo_clip_loss", spy_ppo)
    monkeypatch.setattr(f"{TRAINER}.aggregate", spy_agg)
    monkeypatch.setattr(f"{CREDIT}.response_logprobs_and_stats", spy_lp)
    monkeypatch.setattr(EmbeddingDirectionModel, "score", spy_score)

    cfg = tiny_config(tmp_path / "run", steps=1, algorithm={"micro_batch_size": 8})
    result = train(cfg)
    record = result.history[-1]
    assert record["signals/reward_grad_rows"] == 0 and record["signals/policy_stats_rows"] == 0
    assert seen["grad"] and not any(seen["grad"]), "uniform asked the RM for a gradient"
    assert seen["emb"] and all(e is None for e in seen["emb"]), "uniform computed policy stats"
    # one micro-batch holds the whole step: loss inputs are exactly A_i broadcast over tokens
    (A,), (token_adv,), (mask,) = seen["adv"], seen["ppo"], seen["agg"]
    expected = torch.where(mask, A.float().unsqueeze(1).expand_as(mask), 0.0)
    assert torch.equal(token_adv, expected)


def test_datc_policy_stats_are_of_the_rollout_temperature_distribution(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old-policy pass feeds DATC p_t at the sampling temperature: its p(y_t) equals
    exp(old log-prob), which tests/backends/torch/test_rollout.py checks against generate's
    own logits / T. The trainer knows g first, so it streams W0 (``unsigned_work``): W0 is
    the closed form over the PolicyStats of that same distribution."""
    calls: list[tuple[torch.Tensor, torch.Tensor, Any, torch.Tensor]] = []

    def spy(model: Any, input_ids: Any, attention_mask: Any, R: int, **k: Any) -> Any:
        logp, w0 = response_logprobs_and_work(model, input_ids, attention_mask, R, **k)
        assert k["temperature"] == 0.7
        _, stats = response_logprobs_and_stats(
            model,
            input_ids,
            attention_mask,
            R,
            temperature=k["temperature"],
            reward_embedding=k["reward_embedding"],
        )
        assert stats is not None
        closed_form = token_work(stats, k["reward_grad"], None)
        calls.append((logp, w0, (stats, closed_form), attention_mask[:, -R:].bool()))
        return logp, w0

    monkeypatch.setattr(f"{CREDIT}.response_logprobs_and_work", spy)
    train(tiny_config(tmp_path / "run", steps=1, credit="datc", rollout={"temperature": 0.7}))
    assert len(calls) == 1  # the old-policy pass only
    logp, w0, (stats, closed_form), mask = calls[0]
    torch.testing.assert_close(stats.p_sampled[mask], logp.exp()[mask], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w0[mask], closed_form[mask], rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------- files in the run folder


@pytest.mark.parametrize("strategy", ["uniform", "datc"])
def test_a_run_writes_config_metrics_events_and_checkpoints(tmp_path: Path, strategy: str) -> None:
    run = tmp_path / "run"
    cfg = tiny_config(
        run,
        credit=strategy,
        steps=2,
        eval={"interval": 1},
        checkpoint={"interval": 1},
        algorithm={"kl_coef": 0.05},
        logging={"tensorboard": True},
    )
    result = train(cfg)
    assert load_config(run / "config.yaml") == config_from_dict(cfg)
    records = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2] and records == result.history
    for key in (
        "reward/mean",
        "reward/std",
        "kl/ref",
        "loss/policy",
        "ppo/clip_frac",
        "policy/entropy",
        "response/length_mean",
        "credit/weight_entropy",
        "time/rollout",
        "time/signals",
        "time/signals_reward",
        "time/update",
        "throughput/tokens_per_s",
        "eval/reward_sampled",
        "eval/reward_greedy",
        "optim/lr",
    ):
        assert key in records[1], key
    assert {"eval/reward_sampled", "eval/reward_greedy"} <= set(records[0])
    assert 0 < records[1]["time/signals_reward"] < records[1]["time/signals"]
    events = list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 0
    latest = checkpoint_folders(run / "checkpoints")[-1]
    assert latest.name == "step_000002"
    weights = load_file(str(latest / "model.safetensors"))
    assert "model.embed_tokens.weight" in weights  # the HF model's own key names
    assert {p.name for p in latest.iterdir()} == {
        "state",  # model + optimizer shards (DCP, safetensors)
        "train_state.json",
        "rank0.safetensors",
        "model.safetensors",
        "config.json",
        "manifest.json",
    }


@pytest.mark.parametrize(("hf_export", "exported"), [("final", [2]), ("every", [1, 2])])
def test_the_hugging_face_export_is_written_where_asked(
    tmp_path: Path, hf_export: str, exported: list[int]
) -> None:
    run = tmp_path / "run"
    cfg = tiny_config(run, steps=2, checkpoint={"interval": 1, "hf_export": hf_export})
    train(cfg)
    folders = checkpoint_folders(run / "checkpoints")
    assert [f.name for f in folders] == ["step_000001", "step_000002"]
    assert [
        int(f.name.removeprefix("step_")) for f in folders if (f / "model.safetensors").is_file()
    ] == exported
    assert all((f / "state").is_dir() for f in folders)  # training state in every checkpoint


def test_a_fresh_run_refuses_a_folder_holding_a_run(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path / "run", steps=1)
    train(cfg)
    with pytest.raises(ConfigError, match="already holds a run"):
        train(cfg)


@pytest.mark.parametrize(
    "updates",
    [
        {"credit": "datc", "algorithm": {"kl_coef": 0.05}, "logging": {"tensorboard": True}},
        {"algorithm": {"estimator": "gae"}},
        {"credit": "prime"},
    ],
    ids=["datc_kl_tensorboard", "gae_critic", "prime_prm"],
)
def test_a_closed_run_without_a_process_group_frees_its_models_without_a_collection(
    tmp_path: Path, updates: dict[str, Any]
) -> None:
    """``close`` runs a full garbage collection only where a process group needs it (it
    costs tenths of a second per run in a large process): without one, the last reference to
    the closed recipe dropped frees it, with its policy, reference model, critic or PRM,
    optimizers and rollout engine: no reference cycle holds them."""
    gc.disable()
    try:
        recipe = GRPORecipe(config_from_dict(tiny_config(tmp_path / "run", steps=1, **updates)))
        recipe.run()
        names = ("credit", "ref_model", "critic", "prm")
        held = {n: weakref.ref(getattr(recipe, n)) for n in names if getattr(recipe, n, None)}
        held.update(recipe=weakref.ref(recipe), policy=weakref.ref(recipe.policy.model))
        recipe.close()
        del recipe
        assert {n for n, ref in held.items() if ref() is not None} == set()
    finally:
        gc.enable()


# ---------------------------------------------------------------------------- resume

RESUME_UPDATES: dict[str, Any] = {
    "steps": 4,
    "credit": {"name": "datc_shuffled", "seed": 3},  # a strategy with RNG state
    "algorithm": {"kl_coef": 0.05, "ppo_epochs": 2, "updates_per_epoch": 2, "micro_batch_size": 3},
    "optim": {"lr": 3e-3, "schedule": "linear", "warmup_steps": 1},
    "eval": {"interval": 2},
    "checkpoint": {"interval": 1, "keep_last": 3, "hf_export": "every"},
}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    return train(tiny_config(tmp_path_factory.mktemp("full") / "run", **RESUME_UPDATES))


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    latest = checkpoint_folders(run / "checkpoints")[-1]
    assert latest.name == "step_000004"
    return load_file(str(latest / "model.safetensors"))


def assert_same_run(run: Path, reference: RunResult) -> None:
    got = [comparable(r) for r in read_jsonl(run / "metrics.jsonl")]
    assert got == [comparable(r) for r in reference.history]
    a, b = final_weights(run), final_weights(reference.run_dir)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_after_a_crash_reproduces_the_uninterrupted_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, uninterrupted: RunResult
) -> None:
    run = tmp_path / "run"
    cfg = tiny_config(run, **RESUME_UPDATES)
    crash_in_step_3(cfg, monkeypatch)
    resumed = train(cfg, resume=True)
    assert steps_of(resumed.history) == [3, 4]
    assert_same_run(run, uninterrupted)


KILL_DRIVER = """
import json, os, signal, sys
import backends.torch.checkpoint as ckpt
from backends.torch.trainer import train

real_save_file = ckpt.save_file

def save_file_then_die(tensors, filename, **kw):
    real_save_file(tensors, filename, **kw)
    if str(filename).endswith("step_000003.tmp/model.safetensors"):
        os.kill(os.getpid(), signal.SIGKILL)  # mid-checkpoint: weights written, rest not

ckpt.save_file = save_file_then_die
train(json.loads(sys.argv[1]))
"""


@pytest.mark.slow
def test_a_process_killed_while_checkpointing_resumes_from_the_last_complete_one(
    tmp_path: Path, uninterrupted: RunResult
) -> None:
    run = tmp_path / "run"
    cfg = tiny_config(run, **RESUME_UPDATES)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", KILL_DRIVER, json.dumps(cfg)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    partial = run / "checkpoints" / "step_000003.tmp"
    assert (partial / "model.safetensors").exists() and not (partial / "manifest.json").exists()
    assert checkpoint_folders(run / "checkpoints")[-1].name == "step_000002"
    resumed = train(cfg, resume=True)
    assert steps_of(resumed.history) == [3, 4]
    assert not partial.exists()
    assert_same_run(run, uninterrupted)


def test_resume_refuses_a_changed_config(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path / "run", steps=1, checkpoint={"interval": 1})
    train(cfg)
    changed = {**cfg, "optim": {**cfg["optim"], "lr": 1e-2}, "steps": 2}
    with pytest.raises(ConfigError, match=r"differs .* in \['optim'\]"):
        train(changed, resume=True)


# ------------------------------------------------------------- PPO with a critic (GAE)

GAE_UPDATES: dict[str, Any] = {
    "algorithm": {
        "estimator": "gae",
        "kl_coef": 0.05,
        "ppo_epochs": 2,
        "updates_per_epoch": 2,
        "micro_batch_size": 3,
    },
    "critic": {"lr": 1e-3},
}


def test_a_gae_step_credits_by_the_critic_and_updates_it_beside_the_policy(
    tmp_path: Path,
) -> None:
    recipe = GRPORecipe(config_from_dict(tiny_config(tmp_path / "run", **GAE_UPDATES)))
    try:
        assert recipe.critic is not None
        decoder = recipe.policy.model.get_decoder().state_dict()
        critic = {k: v.clone() for k, v in recipe.critic.state_dict().items()}
        # initialised from the policy's weights, plus a value head
        assert all(torch.equal(critic[f"module.{k}"], v) for k, v in decoder.items())
        assert set(critic) - {f"module.{k}" for k in decoder} == {"value_head.weight"}
        policy = {k: v.clone() for k, v in recipe.model.state_dict().items()}

        prompts, positions, groups = recipe._my_prompts([0, 1], recipe.train_prompts)
        batch = recipe.rollout(
            prompts, positions, groups, group_size=4, greedy=False, tag="rollout"
        )
        signals = recipe.signals(batch, recipe.train_prompts)
        mask = batch.response_mask
        assert signals.values is not None and signals.returns is not None
        values = response_values(
            recipe.critic, batch.input_ids, batch.attention_mask, mask.shape[1]
        )
        torch.testing.assert_close(signals.values, values)
        adv, returns = gae_advantages_and_returns(
            outcome_token_rewards(signals.rewards, mask), values, mask, gamma=1.0, lam=0.95
        )
        torch.testing.assert_close(signals.returns, returns)
        want = whiten(adv, mask, lambda t: t)
        torch.testing.assert_close(signals.token_advantages, want)
        assert float(want[mask].mean()) == pytest.approx(0.0, abs=1e-5)
        # the comparison credits of a gae run keep GRPO's response advantages
        datc = get_strategy(CreditConfig(name="datc"))
        theirs = recipe.signals(batch, recipe.train_prompts, strategy=datc, rewards=recipe.reward)
        assert theirs.values is None
        torch.testing.assert_close(theirs.advantages, group_advantages(signals.rewards, 4))

        update = recipe.update(signals)
        metrics = update.metrics(recipe.ctx, 0.05)
        assert metrics["loss/value"] > 0 and metrics["critic/lr"] == 1e-3
        assert metrics["critic/grad_norm"] > 0 and update.n_updates == 4
        after = recipe.critic.state_dict()
        assert all(not torch.equal(after[k], critic[k]) for k in critic), "a critic tensor froze"
        assert any(not torch.equal(v, policy[k]) for k, v in recipe.model.state_dict().items())
    finally:
        recipe.close()


def _gae_handed(
    recipe: GRPORecipe, monkeypatch: pytest.MonkeyPatch
) -> tuple[Any, Any, torch.Tensor]:
    """One rollout of ``recipe``, its signals, and the token rewards its GAE was handed."""
    import backends.torch.credit as credit

    handed: list[torch.Tensor] = []

    def spy(token_rewards: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        handed.append(token_rewards.clone())
        return gae_advantages_and_returns(token_rewards, *args, **kwargs)

    monkeypatch.setattr(credit, "gae_advantages_and_returns", spy)
    prompts, positions, groups = recipe._my_prompts([0, 1], recipe.train_prompts)
    batch = recipe.rollout(prompts, positions, groups, group_size=4, greedy=False, tag="rollout")
    signals = recipe.signals(batch, recipe.train_prompts)
    assert len(handed) == 1
    return batch, signals, handed[0]


def test_uniform_hands_gae_exactly_the_stock_outcome_rewards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/design.md, "Credit under a critic": uniform's shift is 0, so PPO stays stock."""
    recipe = GRPORecipe(config_from_dict(tiny_config(tmp_path / "run", **GAE_UPDATES)))
    try:
        batch, signals, handed = _gae_handed(recipe, monkeypatch)
        mask = batch.response_mask
        stock = outcome_token_rewards(signals.rewards, mask)
        assert torch.equal(handed, stock)
        assert signals.values is not None  # the critic's values: checked above
        adv, returns = gae_advantages_and_returns(stock, signals.values, mask, gamma=1.0, lam=0.95)
        assert torch.equal(signals.returns, returns)
        assert torch.equal(signals.token_advantages, whiten(adv, mask, lambda t: t))
    finally:
        recipe.close()


@pytest.mark.parametrize("credit", ["datc", {"name": "red", "mode": "paper"}])
def test_a_gae_step_hands_gae_the_outcome_rewards_plus_the_strategys_shift(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, credit: Any
) -> None:
    """The strategy runs as under GRPO (group_norm advantages of the same rollouts) and its
    shift D is added to the outcome token rewards GAE reads (docs/design.md, "Credit under a
    critic"): datc keeps each response's total reward, red's paper form hands its own r_t."""
    cfg = config_from_dict(tiny_config(tmp_path / "run", credit=credit, **GAE_UPDATES))
    recipe = GRPORecipe(cfg)
    try:
        batch, signals, handed = _gae_handed(recipe, monkeypatch)
        mask = batch.response_mask
        outcome = outcome_token_rewards(signals.rewards, mask)
        # the same strategy judged on the batch: GRPO's credit, no critic
        grpo = recipe.signals(
            batch, recipe.train_prompts, strategy=get_strategy(cfg.credit), rewards=recipe.reward
        )
        assert grpo.values is None
        torch.testing.assert_close(grpo.advantages, group_advantages(signals.rewards, 4))
        form = recipe.credit.strategy.critic_reward_form
        assert form is not None
        shift = critic_reward_shift(
            grpo.credit, grpo.advantages, grpo.rewards, torch.arange(8) // 4, mask, form
        )
        assert float(shift.abs().max()) > 1e-4, "the strategy moved no reward"
        torch.testing.assert_close(handed, outcome + shift, atol=1e-6, rtol=0)
        if form == "weights":  # the sum-preserving contract: each response's total stays R_i
            torch.testing.assert_close(handed.sum(dim=1), signals.rewards, atol=1e-5, rtol=0)
        else:  # the paper form's own token rewards replace the outcome reward
            assert grpo.credit.token_rewards is not None
            torch.testing.assert_close(handed, grpo.credit.token_rewards.float(), atol=1e-6, rtol=0)
        assert bool((handed[~mask] == 0).all())
        # GAE and the critic run on them unchanged
        assert signals.values is not None
        returns = gae_advantages_and_returns(handed, signals.values, mask, gamma=1.0, lam=0.95)[1]
        assert torch.equal(signals.returns, returns)
        # the logged credit diagnostics are the strategy's weights'
        assert signals.credit.diagnostics == grpo.credit.diagnostics
    finally:
        recipe.close()


def test_a_gae_run_logs_the_critic_and_resumes_it_bit_for_bit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    updates = {
        **GAE_UPDATES,
        "steps": 4,
        "optim": {"lr": 3e-3, "schedule": "linear", "warmup_steps": 1},
        "checkpoint": {"interval": 1, "keep_last": 3, "hf_export": "every"},
    }
    whole = train(tiny_config(tmp_path / "whole", **updates))
    keys = {"loss/value", "critic/clip_frac", "critic/explained_var", "critic/value_mean"}
    assert all(keys <= set(r) for r in whole.history)
    for record in whole.history:  # the critic's own lr, on the policy's schedule
        assert record["critic/lr"] == pytest.approx(record["optim/lr"] * 1e-3 / 3e-3)

    run = tmp_path / "run"
    cfg = tiny_config(run, **updates)
    crash_in_step_3(cfg, monkeypatch)
    resumed = train(cfg, resume=True)
    assert steps_of(resumed.history) == [3, 4]
    # values, value loss and the policy of steps 3-4 depend on the critic's weights and
    # Adam state: equal metrics and weights mean both were restored
    assert_same_run(run, whole)


# -------------------------------------------------------------------------- learning


@pytest.mark.slow
def test_datc_learns_the_positional_task_and_a_broken_loss_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """40 steps of configs/torch/tiny_datc.yaml raise the held-out sampled reward.

    Measured (seeds 0-3): untrained -0.03..0.06; after 40 steps of datc +1.19..+1.46; with
    the policy loss's sign flipped -0.97..-1.93. The margin 0.5 sits between the two.
    """
    margin = 0.5
    overrides = [
        "logging.progress=false",
        "logging.tensorboard=false",
        "checkpoint.interval=0",
        "eval.interval=40",
    ]

    def gain(run: str) -> float:
        result = train(
            REPO / "configs/torch/tiny_datc.yaml",
            overrides=[*overrides, f"output_dir={tmp_path / run}"],
        )
        series = dict(result.series("eval/reward_sampled"))
        return series[40] - series[0]

    assert gain("datc") > margin

    def flipped(*a: Any, **k: Any) -> Any:
        terms = ppo_clip_loss(*a, **k)
        return type(terms)(-terms.loss, terms.clipped, terms.log_ratio)

    monkeypatch.setattr(f"{TRAINER}.ppo_clip_loss", flipped)
    assert gain("flipped") < margin


# ------------------------------------------------------------------- torchrun, 2 ranks


TORCHRUN_DRIVER = """
import sys
sys.path.insert(0, sys.argv[2])
import backends.torch.trainer as trainer
from tests.helpers.torch_tiny import build_policy_with_frequent_eos

trainer.build_policy = build_policy_with_frequent_eos
trainer.train(sys.argv[1])
"""


TWO_RANK_UPDATES: dict[str, Any] = {
    "steps": 1,
    "credit": "datc",
    "data": {"task_params": {"num_prompts": 16, "num_eval_prompts": 3}},
    # 2 prompts per generate call: the same chunks (and seeds) on 1 rank and on 2 ranks
    "rollout": {"prompts_per_step": 4, "prompts_per_generate": 2},
    "algorithm": {"micro_batch_size": 3, "ppo_epochs": 2, "kl_coef": 0.05},
    # Adam divides by sqrt(v) + eps: with the default 1e-8, parameters whose gradient is
    # ~1e-9 turn float noise into 1e-6-sized update differences (measured 5.6e-6)
    "optim": {"lr": 1e-3, "eps": 1e-6},
    "eval": {"interval": 1},
    "checkpoint": {"interval": 1},
}


@dataclass(frozen=True)
class TwoRankRun:
    """One step of the same config in one process (``one``) and under torchrun (``two``)."""

    strategy: str
    one: RunResult
    two: Path

    def config(self, run: Path, **updates: Any) -> dict[str, Any]:
        return two_rank_config(run, self.strategy, **updates)


def two_rank_config(run: Path, strategy: str, **updates: Any) -> dict[str, Any]:
    return tiny_config(
        run, **{**TWO_RANK_UPDATES, "distributed": {"strategy": strategy}, **updates}
    )


@pytest.fixture(scope="module", params=["ddp", "fsdp"])
def two_rank_run(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> TwoRankRun:
    strategy: str = request.param
    tmp = tmp_path_factory.mktemp(strategy)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(f"{TRAINER}.build_policy", build_policy_with_frequent_eos)
        single = train(two_rank_config(tmp / "one", strategy))
    config_file = tmp / "two.yaml"
    config_file.write_text(yaml.safe_dump(two_rank_config(tmp / "two", strategy)))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    torchrun = Path(sys.executable).with_name("torchrun")
    driver = tmp / "driver.py"
    driver.write_text(TORCHRUN_DRIVER)
    proc = subprocess.run(
        [
            str(torchrun),
            "--standalone",
            "--nproc_per_node",
            "2",
            str(driver),
            str(config_file),
            str(REPO),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return TwoRankRun(strategy, single, tmp / "two")


@pytest.mark.slow
def test_two_process_torchrun_matches_one_process_on_the_same_global_batch(
    two_rank_run: TwoRankRun,
) -> None:
    """One step of 2 ranks == one step of 1 process on the same 4 prompts x G=4 (1e-5).

    Responses end at different lengths on the two ranks (frequent EOS), and the 3 held-out
    prompts split unevenly: FSDP's collective forwards must stay in step regardless.
    """
    single = two_rank_run.one
    assert single.history[-1]["response/truncated_frac"] < 0.9  # EOS does end responses
    one, two = single.history[-1], read_jsonl(two_rank_run.two / "metrics.jsonl")[-1]
    for key in (
        "loss/total",
        "loss/policy",
        "loss/kl",
        "reward/mean",
        "reward/std",
        "kl/ref",
        "optim/grad_norm",
        "credit/weight_max",
        "credit/weight_entropy",
        "response/length_mean",
    ):
        assert two[key] == pytest.approx(one[key], rel=1e-5, abs=1e-5), key
    assert_close_weights(final_weights_at(single.run_dir, 1), final_weights_at(two_rank_run.two, 1))


@pytest.mark.slow
def test_a_two_process_checkpoint_resumes_in_one_process(
    two_rank_run: TwoRankRun,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The 2-rank run's step-1 checkpoint (one shard per rank), continued to step 2 by one
    process, ends where an uninterrupted one-process run of 2 steps ends (1e-5)."""
    monkeypatch.setattr(f"{TRAINER}.build_policy", build_policy_with_frequent_eos)
    uninterrupted = train(two_rank_run.config(tmp_path / "ref", steps=2))
    shards = list((two_rank_run.two / "checkpoints" / "step_000001" / "state").iterdir())
    assert len(shards) == 2  # each rank wrote its own
    run = tmp_path / "two"
    shutil.copytree(two_rank_run.two, run)
    with caplog.at_level(logging.WARNING, logger="backends.torch.checkpoint"):
        resumed = train(two_rank_run.config(run, steps=2), resume=True)
    assert "written by 2 processes, resuming with 1" in caplog.text
    assert steps_of(resumed.history) == [2]
    for key in ("loss/total", "reward/mean", "optim/grad_norm", "eval/reward_sampled"):
        want = uninterrupted.history[-1][key]
        assert resumed.history[-1][key] == pytest.approx(want, rel=1e-5, abs=1e-5), key
    assert_close_weights(final_weights_at(run, 2), final_weights_at(uninterrupted.run_dir, 2))


def assert_close_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst < 1e-5


def final_weights_at(run: Path, step: int) -> dict[str, torch.Tensor]:
    latest = checkpoint_folders(run / "checkpoints")[-1]
    assert latest.name == f"step_{step:06d}"
    return load_file(str(latest / "model.safetensors"))


# ------------------------------------------- a local model folder, MiniLM, JSONL, chat


@pytest.mark.slow
def test_the_gpu_example_config_runs_on_cpu_with_a_tiny_local_policy(tmp_path: Path) -> None:
    """configs/torch/gpu_*.yaml as shipped, with only the model folder, device and sizes
    overridden: a local HF folder (qwen2 family, chat template), prompts from JSONL, the
    MiniLM direction model bridged to the policy's tokenizer, FSDP settings ignored in one
    process."""
    from adapters.tiny import tiny_causal_lm, train_bpe_tokenizer

    tok = train_bpe_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}user: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    model = tiny_causal_lm(
        "qwen2", len(tok), pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id
    )
    model.save_pretrained(tmp_path / "policy")
    tok.save_pretrained(tmp_path / "policy")
    result = train(
        REPO / "configs/torch/gpu_qwen2.5-1.5b_datc_8gpu.yaml",
        overrides=[
            f"policy.path={tmp_path / 'policy'}",
            "device=cpu",
            "distributed.backend=gloo",
            f"output_dir={tmp_path / 'run'}",
            "steps=1",
            "rollout.prompts_per_step=2",
            "rollout.group_size=4",
            "rollout.max_new_tokens=6",
            "data.num_eval_prompts=2",
            "eval.interval=1",
            "logging.progress=false",
            "logging.tensorboard=false",
            "data.train_file=" + str(REPO / "configs/torch/data/helpful_train.jsonl"),
            "data.eval_file=" + str(REPO / "configs/torch/data/helpful_eval.jsonl"),
        ],
    )
    last = result.history[-1]
    assert last["signals/reward_grad_rows"] == 8 and last["signals/policy_stats_rows"] == 8
    assert -1.0 <= last["reward/mean"] <= 1.0  # a cosine similarity
    assert all(math.isfinite(v) for v in last.values())
    assert "eval/reward_sampled" in last and "kl/ref" in last


SCORED: list[tuple[str, Any]] = []


def label_reward(prompts: list[str], responses: list[str], labels: list[Any]) -> list[float]:
    """A text scorer that takes labels: records (prompt, label) and rewards the label."""
    SCORED.extend(zip(prompts, labels, strict=True))
    return [float(label) for label in labels]


def test_jsonl_labels_reach_a_scorer_that_takes_them(tmp_path: Path) -> None:
    train_rows = {f"count the words in line {i}": i % 3 for i in range(6)}
    eval_rows = {"held out line one": 7, "held out line two": 9}
    for name, rows in (("train", train_rows), ("eval", eval_rows)):
        lines = [json.dumps({"prompt": p, "label": lab}) for p, lab in rows.items()]
        (tmp_path / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
    cfg = tiny_config(tmp_path / "run", steps=2, eval={"interval": 2, "greedy": False})
    cfg["data"] = {
        "train_file": str(tmp_path / "train.jsonl"),
        "eval_file": str(tmp_path / "eval.jsonl"),
    }
    cfg["reward"] = {
        "reward": {"kind": "callable", "function": "tests.backends.torch.test_train:label_reward"}
    }
    SCORED.clear()
    history = train(config_from_dict(cfg)).history
    every = {**train_rows, **eval_rows}
    assert SCORED and all(every[prompt] == label for prompt, label in SCORED)
    assert {prompt for prompt, _ in SCORED} & set(eval_rows)  # the held-out rollouts too
    assert history[-1]["eval/reward_sampled"] == pytest.approx(8.0)  # mean of 7 and 9


def test_the_rollout_engine_syncs_only_weights_that_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from backends.torch.rollout import HFRolloutEngine

    synced: list[int] = []
    monkeypatch.setattr(HFRolloutEngine, "sync_weights", lambda self, model: synced.append(1))
    train(config_from_dict(tiny_config(tmp_path / "run", steps=2, eval={"interval": 1})))
    # eval at step 0, rollout 1 (same weights), eval at 1, rollout 2 (same), eval at 2
    assert len(synced) == 3


def test_gradient_checkpointing_recomputes_the_layers_and_changes_no_result(
    tmp_path: Path,
) -> None:
    """policy.gradient_checkpointing: each decoder layer runs again in backward (the policy
    stays in eval mode, where Hugging Face would skip checkpointing), same update."""
    from backends.torch.models import checkpointed_layers

    runs = {}
    for on in (False, True):
        cfg = tiny_config(tmp_path / str(on), steps=1, policy={"gradient_checkpointing": on})
        recipe = GRPORecipe(config_from_dict(cfg))
        layers = checkpointed_layers(recipe.model)
        assert len(layers) == (2 if on else 0)  # the tiny preset's two decoder layers
        calls: list[int] = []
        first = recipe.policy.model.model.layers[0]
        # a pre-hook: a recomputation stops early, once it has what backward needs
        first.register_forward_pre_hook(
            lambda *_, calls=calls: calls.append(int(torch.is_grad_enabled()))
        )
        recipe.train_step()
        runs[on] = (calls, [p.detach().clone() for p in recipe.model.parameters()])
        assert not any(m.training for m in recipe.policy.model.modules())  # eval mode again
        recipe.close()
    grad_calls = {on: sum(calls) for on, (calls, _) in runs.items()}
    assert grad_calls[True] == 2 * grad_calls[False] > 0  # forward, then again in backward
    for a, b in zip(runs[False][1], runs[True][1], strict=True):
        torch.testing.assert_close(a, b)
