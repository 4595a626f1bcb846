"""The native trainer's credit step through ``CreditRun``: the direction model's agreement
with the reward logged every step, and the agreement gate applied, saved and resumed
(docs/design.md, "Trusting the direction model")."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from scipy.stats import spearmanr

from adapters.direction import DirectionModel, RewardOutput
from adapters.scorers import ModelScorer
from adapters.tiny import train_bpe_tokenizer
from backends.common.errors import ConfigError
from backends.common.jsonl import read_jsonl
from backends.common.tasks import PositionalParams, positional_task
from backends.samples.records import SAMPLES_FILE, read_samples
from backends.torch.__main__ import main
from backends.torch.checkpoint import TRAIN_STATE_FILE, checkpoint_folders
from backends.torch.config import config_from_dict as train_config
from backends.torch.rollout import RolloutBatch
from backends.torch.rollout_rewards import RolloutRewards
from backends.torch.step import StepSignals
from backends.torch.trainer import CREDIT_KEY, GRPORecipe, RunResult, train
from credit_core.agreement_gate import gate_token_advantages
from tests.helpers.paths import REPO
from tests.helpers.torch_tiny import comparable, crash_in_step_3, tiny_config

pytestmark = pytest.mark.usefixtures("single_torch_thread")

GROUP = 4  # tiny_config's rollout.group_size


@cache
def _policy_vocab() -> int:
    return len(train_bpe_tokenizer(vocab_size=512))  # the tiny preset's tokenizer


def weak_direction(seed: int) -> DirectionModel:
    """The positional task's reward model drawn with another ``seed``: a direction model
    that ranks the responses differently from the reward (a ``kind: module`` factory)."""
    vocab = _policy_vocab()
    return positional_task(PositionalParams(seed=seed), vocab).build_direction(torch.device("cpu"))


def _module(seed: int) -> dict[str, Any]:
    factory = f"{__name__}:weak_direction"
    return {"kind": "module", "factory": factory, "factory_kwargs": {"seed": seed}}


#: A reward (seed 0's model) and a separate direction model (seed 5's) that disagree in part.
SEPARATE = {"direction_model": _module(5), "reward": {"kind": "model", "model": _module(0)}}
GATE = {"agreement": [-1.0, 1.0], "decay": 0.5}  # alpha = (ema + 1) / 2, strictly inside (0, 1)


def gated(**credit: Any) -> dict[str, Any]:
    return {"name": "datc", "gate": GATE, **credit}


@pytest.fixture
def scored(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[RolloutBatch, RewardOutput]]]:
    """Every training reward pass's batch and output (rewards, the direction model's scores)."""
    outputs: list[tuple[RolloutBatch, RewardOutput]] = []
    real = RolloutRewards.compute

    def spy(self: RolloutRewards, batch: RolloutBatch, **kwargs: Any) -> RewardOutput:
        out = real(self, batch, **kwargs)
        outputs.append((batch, out))
        return out

    monkeypatch.setattr(RolloutRewards, "compute", spy)
    yield outputs


@pytest.fixture
def step_signals(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[StepSignals]]:
    """The ``StepSignals`` of every training step."""
    seen: list[StepSignals] = []
    real = GRPORecipe.signals

    def spy(self: GRPORecipe, *args: Any, **kwargs: Any) -> StepSignals:
        out = real(self, *args, **kwargs)
        seen.append(out)
        return out

    monkeypatch.setattr(GRPORecipe, "signals", spy)
    yield seen


def brute_force_agreement(scores: torch.Tensor, rewards: torch.Tensor) -> tuple[float, int]:
    """Mean of scipy's Spearman rho over the groups of ``GROUP`` consecutive responses whose
    reward varies (a group with constant scores counts 0); and that number of groups."""
    rhos = []
    for s, r in zip(scores.view(-1, GROUP), rewards.view(-1, GROUP), strict=True):
        if len(set(r.tolist())) < 2:
            continue
        rhos.append(0.0 if len(set(s.tolist())) < 2 else float(spearmanr(s, r).statistic))
    return (float(np.mean(rhos)) if rhos else math.nan), len(rhos)


# ---------------------------------------------------------------------- the measurement


@pytest.mark.parametrize("strategy", ["datc", "red"])
def test_the_logged_agreement_is_the_spearman_of_the_step_s_own_scores(
    tmp_path: Path, scored: list[tuple[RolloutBatch, RewardOutput]], strategy: str
) -> None:
    result = train(tiny_config(tmp_path / "run", steps=3, credit=strategy, reward=SEPARATE))
    assert len(scored) == 3  # one reward pass a step: the scores come from it, no other
    direction, reward = ModelScorer(weak_direction(5)), ModelScorer(weak_direction(0))
    for record, (batch, out) in zip(result.history, scored, strict=True):
        rollout = (batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask)
        assert torch.equal(out.rewards, reward(*rollout))
        assert out.direction_scores is not None
        assert torch.allclose(out.direction_scores, direction(*rollout), atol=1e-6)
        want, groups = brute_force_agreement(out.direction_scores, out.rewards)
        assert record["credit/direction_is_reward"] == 0.0
        assert record["credit/agreement_groups"] == groups
        assert record["credit/agreement_skipped"] == 2 - groups  # 2 prompts a step
        if groups:
            assert record["credit/direction_agreement"] == pytest.approx(want, abs=1e-12)
        else:
            assert math.isnan(record["credit/direction_agreement"])
        assert "credit/gate_alpha" not in record  # no gate: nothing mixed
    values = [r["credit/direction_agreement"] for r in result.history]
    assert any(-1 < v < 1 for v in values)  # the two models disagree in part: a real measure
    logged = list(read_jsonl(tmp_path / "run" / "metrics.jsonl"))
    assert [r["credit/agreement_groups"] for r in logged] == [
        r["credit/agreement_groups"] for r in result.history
    ]


def test_a_direction_model_that_is_the_reward_is_reported_as_such(tmp_path: Path) -> None:
    """The task's own model sets the reward and the direction: agreement 1 by construction,
    so no number is logged for it; a strategy that reads no direction model logs neither."""
    datc = train(tiny_config(tmp_path / "datc", steps=1, credit="datc")).history[0]
    assert datc["credit/direction_is_reward"] == 1.0
    assert not {k for k in datc if "agreement" in k or "gate" in k}
    uniform = train(tiny_config(tmp_path / "uniform", steps=1)).history[0]
    assert not {k for k in uniform if "direction" in k or "agreement" in k or "gate" in k}


# ----------------------------------------------------------------------------- the gate


def test_the_gate_s_alpha_follows_the_ema_of_the_logged_agreement(tmp_path: Path) -> None:
    history = train(tiny_config(tmp_path / "run", steps=4, credit=gated(), reward=SEPARATE)).history
    ema = None
    for record in history:
        value = record["credit/direction_agreement"]
        if record["credit/agreement_groups"]:
            ema = value if ema is None else 0.5 * ema + 0.5 * value
        if ema is None:
            assert math.isnan(record["credit/direction_agreement_ema"])
            assert record["credit/gate_alpha"] == 0.0
        else:
            assert record["credit/direction_agreement_ema"] == pytest.approx(ema, abs=1e-12)
            assert record["credit/gate_alpha"] == pytest.approx((ema + 1) / 2, abs=1e-12)
    assert ema is not None


def test_the_credit_samples_carry_the_step_s_agreement_as_logged(tmp_path: Path) -> None:
    """credit-view shows the agreement of each recorded step: the record holds the step's
    logged values (``StepAgreement``)."""
    run = tmp_path / "run"
    cfg = tiny_config(run, steps=4, credit=gated(), reward=SEPARATE, credit_samples={"interval": 2})
    logged = {r["step"]: r for r in train(cfg).history}
    records = read_samples(run / SAMPLES_FILE)
    assert [r.step for r in records] == [2, 4]
    for record in records:
        step, agreement = logged[record.step], record.agreement
        assert agreement is not None and not agreement.direction_is_reward
        assert agreement.groups == step["credit/agreement_groups"]
        assert agreement.skipped == step["credit/agreement_skipped"]
        for key, value in [
            ("credit/direction_agreement", agreement.agreement),
            ("credit/direction_agreement_ema", agreement.ema),
        ]:
            if math.isnan(step[key]):
                assert value is None
            else:
                assert value == pytest.approx(step[key], rel=1e-5)
        assert agreement.alpha == pytest.approx(step["credit/gate_alpha"], rel=1e-5)
    is_reward = tmp_path / "is_reward"
    train(tiny_config(is_reward, steps=2, credit="datc", credit_samples={"interval": 2}))
    (record,) = read_samples(is_reward / SAMPLES_FILE)
    assert record.agreement is not None and record.agreement.direction_is_reward
    plain = tmp_path / "uniform"
    train(tiny_config(plain, steps=2, credit_samples={"interval": 2}))
    assert read_samples(plain / SAMPLES_FILE)[0].agreement is None
    assert "agreement" not in (plain / SAMPLES_FILE).read_text()  # absent, not null


def test_the_trainer_mixes_the_strategy_s_token_advantages_by_alpha(
    tmp_path: Path, step_signals: list[StepSignals]
) -> None:
    """Step 1 of a gated and an ungated run sees the same batch: the gated token advantages
    are A + alpha (a - A) of the ungated ones, keep each response's mean and A's sign."""
    plain = train(tiny_config(tmp_path / "plain", steps=1, credit="datc", reward=SEPARATE))
    gate = train(tiny_config(tmp_path / "gate", steps=1, credit=gated(), reward=SEPARATE))
    ungated, mixed = step_signals
    assert torch.equal(ungated.batch.response_ids, mixed.batch.response_ids)
    assert torch.equal(ungated.advantages, mixed.advantages)
    alpha = gate.history[0]["credit/gate_alpha"]
    assert 0.0 < alpha < 1.0
    mask, A = mixed.batch.response_mask, mixed.advantages
    want = gate_token_advantages(ungated.token_advantages, A, mask, alpha)
    assert torch.equal(mixed.token_advantages, want)
    assert not torch.equal(mixed.token_advantages, ungated.token_advantages)
    n = mask.sum(dim=1)
    mean = mixed.token_advantages.double().sum(dim=1) / n
    assert torch.allclose(mean, A.double(), atol=1e-6)
    a = mixed.token_advantages
    assert bool(((a * A[:, None] >= 0) | ~mask).all())
    # the strategy's diagnostics are its own weights', the same in both runs
    keys = ("credit/weight_max", "credit/weight_min", "credit/weight_entropy")
    assert [plain.history[0][k] for k in keys] == [gate.history[0][k] for k in keys]


def test_a_gate_on_attribution_mixes_by_the_logged_attribution_agreement_s_ema(
    tmp_path: Path, step_signals: list[StepSignals]
) -> None:
    """DATC with ``gate: {measure: attribution}``: the trainer computes the reward attribution from
    the gradient it takes anyway, logs its agreement each step (scipy's Spearman of the summed
    attribution, group by group), and alpha follows its EMA; the score agreement is still
    logged beside it. The direction model may then be the reward itself."""
    on = {**GATE, "measure": "attribution"}
    history = train(
        tiny_config(tmp_path / "run", steps=3, credit=gated(gate=on), reward=SEPARATE)
    ).history
    ema = None
    for record, signals in zip(history, step_signals, strict=True):
        assert signals.credit.token_advantages is not None
        assert "credit/direction_agreement" in record
        value = record["credit/attribution_agreement"]
        if not math.isnan(value):
            ema = value if ema is None else 0.5 * ema + 0.5 * value
        assert record["credit/attribution_agreement_ema"] == pytest.approx(
            ema if ema is not None else math.nan, abs=1e-12, nan_ok=True
        )
        want_alpha = 0.0 if ema is None else (ema + 1) / 2
        assert record["credit/gate_alpha"] == pytest.approx(want_alpha, abs=1e-12)
        assert "credit/direction_agreement_ema" not in record
    assert ema is not None and -1 < ema < 1
    same = train(tiny_config(tmp_path / "same", steps=1, credit=gated(gate=on))).history[0]
    assert same["credit/direction_is_reward"] == 1.0
    assert math.isfinite(same["credit/attribution_agreement"])


def test_the_logged_attribution_agreement_is_the_spearman_of_the_summed_attribution(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    scored: list[tuple[RolloutBatch, RewardOutput]],
) -> None:
    from backends.common import credit as common_credit

    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    real = common_credit.summed_attribution

    def spy(attribution: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        seen.append((attribution.detach().clone(), mask.clone()))
        return real(attribution, mask)

    monkeypatch.setattr(common_credit, "summed_attribution", spy)
    on = {**GATE, "measure": "attribution"}
    history = train(
        tiny_config(tmp_path / "run", steps=3, credit=gated(gate=on), reward=SEPARATE)
    ).history
    assert len(seen) == len(scored) == len(history) == 3
    measured = 0
    for record, (attribution, mask), (_, out) in zip(history, seen, scored, strict=True):
        summed = (attribution.double() * mask).sum(dim=1)
        want, groups = brute_force_agreement(summed, out.rewards)
        assert record["credit/agreement_groups"] == groups
        if groups:
            measured += 1
            assert record["credit/attribution_agreement"] == pytest.approx(want, abs=1e-12)
    assert measured


RESUME = {
    "steps": 4,
    "credit": gated(),
    "reward": SEPARATE,
    "checkpoint": {"interval": 1, "keep_last": 4},
}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    return train(tiny_config(tmp_path_factory.mktemp("full") / "run", **RESUME))


def test_a_resumed_gated_run_continues_the_ema_bit_for_bit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, uninterrupted: RunResult
) -> None:
    run = tmp_path / "run"
    cfg = tiny_config(run, **RESUME)
    crash_in_step_3(cfg, monkeypatch)
    resumed = train(cfg, resume=True)
    assert [r["step"] for r in resumed.history] == [3, 4]
    got = [comparable(r) for r in read_jsonl(run / "metrics.jsonl")]
    assert got == [comparable(r) for r in uninterrupted.history]
    assert uninterrupted.history[1]["credit/agreement_groups"] > 0  # an EMA to carry over


def test_the_gate_s_ema_is_saved_under_its_own_key_only_with_a_gate(
    uninterrupted: RunResult, tmp_path: Path
) -> None:
    def trainer_state(run: Path) -> dict[str, Any]:
        folder = checkpoint_folders(run / "checkpoints")[-1]
        state: dict[str, Any] = json.loads((folder / TRAIN_STATE_FILE).read_text())["trainer"]
        return state

    gated_state = trainer_state(uninterrupted.run_dir)
    ema = uninterrupted.history[-1]["credit/direction_agreement_ema"]
    assert gated_state[CREDIT_KEY] == {"gate": {"ema": ema}}
    plain = tmp_path / "plain"
    train(tiny_config(plain, steps=1, credit="datc", reward=SEPARATE, checkpoint={"interval": 1}))
    assert set(trainer_state(plain)) == {"sampler"}  # the keys of a run without a gate


# ------------------------------------------------------------------------ bad settings


@pytest.mark.parametrize(
    ("credit", "named"),
    [
        ({"name": "uniform", "gate": GATE}, "credit.gate: strategy 'uniform' reads no direction"),
        (
            {"name": "p2t", "mode": "paper", "gate": GATE},
            "credit.gate: strategy 'p2t' with mode 'paper' gives token rewards",
        ),
        ({"name": "datc", "gate": {"agreement": [0.5, 0.2]}}, "gate.agreement: expected"),
        ({"name": "datc", "gate": {"agreement": [0.1, 0.5], "decay": 1.0}}, "gate.decay"),
    ],
)
def test_credit_train_refuses_a_bad_gate_naming_the_key_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], credit: dict[str, Any], named: str
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(tiny_config(tmp_path / "run", credit=credit)))
    assert main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("credit-train: error:") == 1 and "Traceback" not in err
    assert named in err, err


def test_a_gate_is_refused_where_the_direction_model_is_the_reward(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"credit.gate: the reward is the direction model's"):
        train(tiny_config(tmp_path / "run", credit=gated()))


# ------------------------------------------------------------------- torchrun, 2 ranks

TWO_RANKS = {
    "steps": 2,
    "credit": gated(),
    "reward": SEPARATE,
    "data": {"task_params": {"num_prompts": 16, "num_eval_prompts": 3}},
    # 2 prompts per generate call: the same chunks (and seeds) on 1 rank and on 2 ranks
    "rollout": {"prompts_per_step": 4, "prompts_per_generate": 2},
    "algorithm": {"micro_batch_size": 4},
    "optim": {"lr": 1e-3, "eps": 1e-6},
    "distributed": {"strategy": "ddp"},
}


@pytest.mark.slow
def test_two_processes_measure_the_step_s_agreement_and_share_one_alpha(tmp_path: Path) -> None:
    """Each rank measures its own groups; one sum gives the step's agreement, the same EMA
    and alpha on both ranks, equal to one process's on the same global batch."""
    one = train(tiny_config(tmp_path / "one", **TWO_RANKS)).history
    config = tmp_path / "two.yaml"
    config.write_text(yaml.safe_dump(tiny_config(tmp_path / "two", **TWO_RANKS)))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), "--standalone", "--nproc_per_node", "2", "-m", "backends.torch"]
    proc = subprocess.run(
        [*command, str(config)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    two = read_jsonl(tmp_path / "two" / "metrics.jsonl")
    assert sum(r["credit/agreement_groups"] for r in one) > 0
    for a, b in zip(one, two, strict=True):
        for key in ("credit/agreement_groups", "credit/agreement_skipped"):
            assert a[key] == b[key], key
        for key in ("credit/direction_agreement", "credit/direction_agreement_ema"):
            assert b[key] == pytest.approx(a[key], abs=1e-12, nan_ok=True), key
        assert b["credit/gate_alpha"] == pytest.approx(a["credit/gate_alpha"], abs=1e-12)
        assert b["loss/total"] == pytest.approx(a["loss/total"], rel=1e-5, abs=1e-5)


def test_a_gate_on_a_compared_credit_is_refused_not_dropped(tmp_path: Path) -> None:
    compare = {"compare": ["datc", gated()]}
    with pytest.raises(ConfigError, match=r"credit_samples\.compare\.1\.gate: a compared credit"):
        train_config(tiny_config(tmp_path / "run", credit_samples=compare))
