"""``CreditPPOTrainer`` as verl builds it: picked by verl's trainer registry from
``trainer.v1.trainer_mode``, constructed on verl's composed config (no Ray needed for
that), then verl's synchronous trainer in every respect verl's own code checks."""

from __future__ import annotations

import pytest

pytest.importorskip("verl", reason="the verl tests run in .venv-verl (make verl)")

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
import transfer_queue as tq
from omegaconf import OmegaConf
from tensordict import TensorDict
from verl import DataProto
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager
from verl.trainer.ppo.core_algos import compute_gae_advantage_return, kl_penalty
from verl.trainer.ppo.v1 import get_trainer_cls
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils import tensordict_utils as tu
from verl.workers.utils.padding import response_from_nested

from backends.verl.cli import checked_config, verl_overrides
from backends.verl.config import BACKEND, SCORES_FIELD, SIGNAL_FIELDS, TRAINER_MODE
from backends.verl.credit import grpo_advantages, response_advantages
from backends.verl.engine import WORK_FIELD, WORK_REQUEST_KEY, CreditFSDPEngine
from backends.verl.trainer import CreditPPOTrainer
from credit_core import CreditError, CreditSignals, assign_credit, get_strategy
from credit_core.agreement_gate import direction_agreement
from credit_core.plan import CreditPlan
from credit_core.registry import strategy_class
from credit_core.token_rewards import critic_reward_shift
from tests.backends.verl.engines import (
    MICRO_BATCH,
    PROMPTS,
    RESPONSES,
    build_engine,
    infer,
    old_log_prob_batch,
)
from tests.backends.verl.layouts import nested, v1_batch, verl_grpo
from tests.backends.verl.test_gpu_smoke import settings
from tests.helpers.process_formula import process_advantages


def smoke_config(*extra: str):
    found = settings()
    overrides = verl_overrides([*found["VERL_COMMON"], *found["VERL_DATC"], *extra])
    config = checked_config([*overrides, f"trainer.v1.trainer_mode={TRAINER_MODE}"])
    OmegaConf.resolve(config)  # as verl's TaskRunner does before building the trainer
    return config


def counted_constructions(monkeypatch: pytest.MonkeyPatch, name: str) -> list[object]:
    """Every instance of strategy ``name``'s class built from now on (its ``__init__``
    wrapped)."""
    cls = strategy_class(name)
    built: list[object] = []
    init = cls.__init__

    def counting(self: object, *args: Any, **kwargs: Any) -> None:
        built.append(self)
        init(self, *args, **kwargs)

    monkeypatch.setattr(cls, "__init__", counting)
    return built


def test_verl_builds_the_credit_trainer_as_its_sync_trainer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One strategy instance in the trainer's process: ``credit_settings`` builds the run
    (its plan and strategy) once, and nothing else in the trainer builds another."""
    config = smoke_config()
    built = counted_constructions(monkeypatch, "datc")
    trainer = get_trainer_cls(config.trainer.v1.trainer_mode)(config=config)
    assert built == [trainer.credit.run.strategy]
    assert type(trainer) is CreditPPOTrainer
    assert trainer.trainer_mode == "sync" and type(trainer.replay_buffer) is ReplayBuffer
    assert trainer.credit.plan.name == "datc" and trainer.work_request is not None
    assert trainer.credit.plan.strategy.name == "datc"


def test_a_bad_credit_key_stops_the_trainer_before_any_worker() -> None:
    config = smoke_config()
    config.algorithm.credit = "saliency"
    with pytest.raises(CreditError, match="'saliency' is not served"):
        CreditPPOTrainer(config=config)


def test_the_gates_ema_is_saved_in_verls_checkpoint_and_resumed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``algorithm.credit.gate``: the EMA goes into verl's checkpoint folder of the step
    (``credit.pt``, written before verl's own save marks the folder latest) and comes back
    when verl resumes that step; a gated run resumed from a checkpoint without it stops,
    naming the file."""
    config = smoke_config(f"trainer.default_local_dir={tmp_path}", "trainer.resume_mode=auto")
    config.algorithm.credit = {"name": "datc", "gate": {"agreement": [0.2, 0.6]}}
    trainer = CreditPPOTrainer(config=config)
    assert trainer.credit.run.gate is not None
    trainer.credit.run.gate.ema = 0.45
    folder = tmp_path / "global_step_3"
    saved: list[list[str]] = []
    monkeypatch.setattr(
        PPOTrainerSync, "_save_checkpoint", lambda self: saved.append(sorted(os.listdir(folder)))
    )
    trainer.global_steps = 3
    trainer._save_checkpoint()
    assert saved == [["credit.pt"]]

    def verl_resumes_step_3(self: Any) -> None:
        self.global_steps = 3

    monkeypatch.setattr(PPOTrainerSync, "_load_checkpoint", verl_resumes_step_3)
    resumed = CreditPPOTrainer(config=config)
    resumed._load_checkpoint()
    assert resumed.credit.run.gate is not None and resumed.credit.run.gate.ema == 0.45
    (folder / "credit.pt").unlink()
    with pytest.raises(CreditError, match=r"credit\.pt: credit state: the run has a gate"):
        CreditPPOTrainer(config=config)._load_checkpoint()


class EngineWorkerGroup:
    """verl's actor worker group reduced to the one call the trainer's old-log-prob step
    makes, served by one in-process engine the way verl's TransferQueue dispatch serves it:
    the batch's fields read from TransferQueue with its ``extra_info`` as non-tensor data
    (plus the engine settings ``TrainingWorker.infer_batch`` adds), the engine's
    ``infer_batch``, its model outputs written back as fields."""

    INPUTS = ("prompts", "responses", "response_mask", "loss_mask", "input_ids", "position_ids")

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.requests: list[Any] = []
        self.forwards = 0

    def compute_log_prob(self, batch: Any) -> Any:
        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=list(self.INPUTS)
        )
        tu.assign_non_tensor(
            data,
            use_remove_padding=True,
            use_dynamic_bsz=False,
            micro_batch_size_per_gpu=MICRO_BATCH,
            max_token_len_per_gpu=4096,
            use_fused_kernels=False,
            **batch.extra_info,
        )
        self.requests.append(batch.extra_info.get(WORK_REQUEST_KEY))
        output, forwards = infer(self.engine, data)
        self.forwards += forwards
        fields = TensorDict(dict(output), batch_size=len(batch.keys))
        return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=fields)


@pytest.fixture(scope="module")
def transfer_queue() -> Iterator[None]:
    """A local Ray with TransferQueue (one storage unit), as verl's TaskRunner starts it."""
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
    yield
    tq.close()
    ray.shutdown()


def test_old_log_prob_and_advantage_steps_through_transfer_queue(
    models: tuple[Path, Path], process_group: None, transfer_queue: None
) -> None:
    """verl's own ``_compute_old_log_prob`` and ``_compute_advantage`` (GRPO) with the
    credit trainer's additions, on real TransferQueue: the work request reaches the engine
    for the old-log-prob forward only (no other policy forward: one per micro-batch), the
    stored advantages are DATC's token advantages of verl's GRPO advantage and the engine's
    W0, and verl's step metrics carry the direction model's agreement with verl's reward
    (its scores shipped by the engine, the rewards and uids verl stored)."""
    policy, rm = models
    config = smoke_config("actor_rollout_ref.rollout.n=2", "algorithm.credit_stats_chunk_size=64")
    config.algorithm.direction = {"kind": "seq_classification", "path": str(rm)}
    trainer = get_trainer_cls(config.trainer.v1.trainer_mode)(config=config)
    engine = build_engine(CreditFSDPEngine, policy, packed=True)
    workers = EngineWorkerGroup(engine)
    trainer.actor_rollout_wg = workers

    rows = v1_batch(PROMPTS, RESPONSES, engine.model_config.hf_config.vocab_size)
    scores = torch.tensor([1.0, 0.0, 0.25, 0.75])
    rm_scores = [torch.zeros(r) for r in RESPONSES]
    for row, r in enumerate(RESPONSES):
        rm_scores[row][r - 1] = scores[row]
    rows["rm_scores"] = nested(rm_scores)
    rows["uid"] = torch.tensor([0, 0, 1, 1])
    # what the rollout server reports (verl compares it with the old log-probs)
    rows["rollout_log_probs"] = nested([-torch.ones(r) for r in RESPONSES])
    keys = [f"p{i // 2}_{i}_0" for i in range(len(PROMPTS))]
    batch = tq.kv_batch_put(keys=keys, partition_id="train", fields=rows)

    metrics: dict[str, Any] = {}
    batch = trainer._compute_old_log_prob(batch, metrics)
    assert WORK_REQUEST_KEY not in batch.extra_info
    assert workers.requests == [trainer.work_request]
    assert workers.forwards == len(PROMPTS) // MICRO_BATCH  # verl's own count: no extra
    batch = trainer._compute_advantage(batch, metrics)
    stored = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["advantages"])

    direct, _ = infer(engine, old_log_prob_batch(engine, trainer.work_request, temperature=1.0))
    work = response_from_nested(direct[WORK_FIELD], rows["response_mask"]).to_padded_tensor(0.0)
    mask = rows["response_mask"].to_padded_tensor(0).bool()
    grpo = verl_grpo(scores, RESPONSES, group=2)
    expected = assign_credit(
        get_strategy("datc"),
        response_advantages(grpo, mask),
        mask,
        rows["responses"].to_padded_tensor(0).long(),
        CreditSignals(unsigned_work=work),
    )
    got = stored["advantages"].to_padded_tensor(0.0)
    torch.testing.assert_close(got, expected.token_advantages)
    assert not torch.allclose(got, grpo)
    assert metrics["credit/weight_max"] > 1.0
    direction = response_from_nested(direct[SCORES_FIELD], rows["response_mask"])
    last = direction.to_padded_tensor(0.0).sum(dim=-1)
    want = direction_agreement(last, scores, rows["uid"])
    assert metrics["credit/direction_is_reward"] == 0.0 and want.groups == 2
    assert metrics["credit/direction_agreement"] == pytest.approx(want.value, abs=1e-6)


def gae_config(credit: str, kl: bool, policy: Path, rm: Path):
    """The smoke run's settings with verl's critic estimator (GAE), 2 samples per prompt,
    ``credit`` and, with ``kl``, verl's KL penalty in the reward."""
    found = settings()
    common = [o for o in found["VERL_COMMON"] if not o.startswith("algorithm.adv_estimator=")]
    extra = [
        "algorithm.adv_estimator=gae",
        "algorithm.gamma=0.9",
        "algorithm.lam=0.8",
        f"algorithm.use_kl_in_reward={str(kl).lower()}",
        "algorithm.kl_ctrl.kl_coef=0.1",
        "actor_rollout_ref.rollout.n=2",
        "critic.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        f"critic.model.path={policy}",
        f"algorithm.credit={credit}",
        f"algorithm.direction={{kind:seq_classification,path:{rm}}}",
        "algorithm.credit_stats_chunk_size=64",
    ]
    overrides = verl_overrides([*common, *extra])
    config = checked_config([*overrides, f"trainer.v1.trainer_mode={TRAINER_MODE}"])
    OmegaConf.resolve(config)
    return config


SIGNAL_OF = {
    "datc": "unsigned_work",
    "{name:red,mode:paper}": "prefix_rewards",
    "{name:p2t,mode:paper}": "reward_attribution",
}


@pytest.mark.parametrize("kl", [False, True], ids=["no_kl", "kl_in_reward"])
@pytest.mark.parametrize(
    "credit", ["uniform", "datc", "{name:red,mode:paper}", "{name:p2t,mode:paper}"]
)
def test_gae_reads_verls_token_rewards_plus_the_strategys_shift(
    models: tuple[Path, Path], process_group: None, transfer_queue: None, credit: str, kl: bool
) -> None:
    """Under ``algorithm.adv_estimator=gae`` the credit trainer's ``_compute_advantage`` is
    verl's own on token rewards = stock + D (docs/design.md, "Credit under a critic"): D =
    ``critic_reward_shift`` of the strategy run on verl's GRPO advantages of the same
    rollouts and the engine's signal; the stored advantages and returns are verl's
    ``compute_gae_advantage_return`` of them; with KL in the reward, the stored
    ``token_level_rewards`` are verl's (scores - beta KL) + D; the stored scores are left
    as they were. ``uniform`` is verl's step bit for bit."""
    policy, rm = models
    config = gae_config(credit, kl, policy, rm)
    trainer = get_trainer_cls(config.trainer.v1.trainer_mode)(config=config)
    assert trainer.critic
    engine = build_engine(CreditFSDPEngine, policy, packed=True)
    workers = EngineWorkerGroup(engine)
    trainer.actor_rollout_wg = workers

    rows = v1_batch(PROMPTS, RESPONSES, engine.model_config.hf_config.vocab_size)
    scores = torch.tensor([1.0, 0.0, 0.25, 0.75])
    rm_scores = [torch.zeros(r) for r in RESPONSES]
    for row, r in enumerate(RESPONSES):
        rm_scores[row][r - 1] = scores[row]
    gen = torch.Generator().manual_seed(5)
    rows["rm_scores"] = nested(rm_scores)
    rows["uid"] = torch.tensor([0, 0, 1, 1])
    rows["rollout_log_probs"] = nested([-torch.ones(r) for r in RESPONSES])
    rows["values"] = nested([torch.randn(r, generator=gen) for r in RESPONSES])
    rows["ref_log_prob"] = nested([-torch.rand(r, generator=gen) for r in RESPONSES])
    keys = [f"g{credit}{kl}_{i}_0" for i in range(len(PROMPTS))]
    batch = tq.kv_batch_put(keys=keys, partition_id="train", fields=rows)

    metrics: dict[str, Any] = {}
    batch = trainer._compute_old_log_prob(batch, metrics)
    assert workers.forwards == len(PROMPTS) // MICRO_BATCH
    workers.forwards = 0
    batch = trainer._compute_advantage(batch, metrics)
    names = ["advantages", "returns", "rm_scores", "old_log_probs"]
    stored = tq.kv_batch_get(
        keys=keys,
        partition_id="train",
        select_fields=names + (["token_level_rewards"] if kl else []),
    ).to_padded_tensor()

    mask = rows["response_mask"].to_padded_tensor(0).bool()
    padded = rows.select("rm_scores", "values", "ref_log_prob").to_padded_tensor()
    stock = padded["rm_scores"]
    if kl:
        beta = trainer.kl_ctrl_in_reward.value
        kld = kl_penalty(
            stored["old_log_probs"], padded["ref_log_prob"], config.algorithm.kl_penalty
        )
        stock = stock - beta * (kld * mask)
    shift = torch.zeros_like(stock)
    plan = CreditPlan.build(trainer.credit.section.credit, BACKEND)
    if plan.name != "uniform":
        signal = SIGNAL_OF[credit]
        request = trainer.work_request
        direct, _ = infer(engine, old_log_prob_batch(engine, request, temperature=1.0))
        values = response_from_nested(direct[SIGNAL_FIELDS[signal]], rows["response_mask"])
        groups = rows["uid"]
        grpo = grpo_advantages(padded["rm_scores"], mask, groups)
        A = response_advantages(grpo, mask)
        result = assign_credit(
            plan.strategy,
            A,
            mask,
            rows["responses"].to_padded_tensor(0).long(),
            CreditSignals(**{signal: values.to_padded_tensor(0.0)}),
            rewards=scores,
            groups=groups,
        )
        form = plan.strategy.critic_reward_form
        assert form is not None
        shift = critic_reward_shift(result, A, scores, groups, mask, form)
        assert float(shift.abs().max()) > 0 and metrics["credit/weight_max"] != 1.0
        assert metrics["credit/direction_is_reward"] == 0.0  # each reads a direction model
        assert metrics["credit/agreement_groups"] == 2
    want_adv, want_ret = compute_gae_advantage_return(
        stock + shift, padded["values"], mask.float(), config.algorithm.gamma, config.algorithm.lam
    )
    assert torch.equal(stored["rm_scores"], padded["rm_scores"])  # put back as they were
    got_adv, got_ret = stored["advantages"][mask], stored["returns"][mask]
    if plan.name == "uniform":  # verl's own step: bit for bit
        assert torch.equal(got_adv, want_adv[mask]) and torch.equal(got_ret, want_ret[mask])
        return
    if kl:
        torch.testing.assert_close(stored["token_level_rewards"][mask], (stock + shift)[mask])
    torch.testing.assert_close(got_adv, want_adv[mask])
    torch.testing.assert_close(got_ret, want_ret[mask])
    _, stock_ret = compute_gae_advantage_return(
        stock, padded["values"], mask.float(), config.algorithm.gamma, config.algorithm.lam
    )
    assert not torch.allclose(got_ret, stock_ret[mask])  # the shift moved the returns


def step_spans(ids: list[int]) -> list[tuple[int, int, float]]:
    """Per-step rewards of a response's token ids: two steps, its halves, scored by a rule
    on their end tokens (one step for a one-token response)."""
    half = max(len(ids) // 2, 1)
    spans = [(0, half, float(ids[half - 1] % 2))]
    if half < len(ids):
        spans.append((half, len(ids), float(ids[-1] % 3 == 0)))
    return spans


def step_compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any]
) -> dict[str, Any]:
    """A ``compute_score`` that gives per-step rewards beside its outcome (docs/verl.md): the
    solution is decoded by ``SpaceTokenizer`` (one token id a word)."""
    ids = [int(word) for word in solution_str.split()]
    return {"score": float(ground_truth), "step_rewards": step_spans(ids)}


class SpaceTokenizer:
    """The one tokenizer call verl's reward manager makes: ids decoded as words."""

    def decode(self, ids: torch.Tensor, skip_special_tokens: bool = True) -> str:
        return " ".join(str(int(i)) for i in ids)


def scored_rows(rows: TensorDict, scores: torch.Tensor) -> TensorDict:
    """``rows`` scored as verl's agent loop scores them: verl's reward-loop
    ``NaiveRewardManager.run_single`` with ``step_compute_score`` per sample (the score
    its ground truth), its result an ``AgentLoopOutput``'s ``reward_score`` and extra
    fields, stored with ``as_dict()`` (``rm_scores`` at the last token, ``extra_fields``)
    through ``list_of_dict_to_tensordict``, as ``AgentLoopWorkerTQ`` puts them."""
    manager = NaiveRewardManager(OmegaConf.create({}), SpaceTokenizer(), step_compute_score)
    outputs = []
    for i in range(len(scores)):
        prompt, response = rows["prompts"][i], rows["responses"][i]
        data = DataProto.from_dict(
            tensors={
                "responses": response.unsqueeze(0),
                "attention_mask": torch.ones(1, len(prompt) + len(response), dtype=torch.long),
            },
            non_tensors={
                "data_source": np.array(["steps"], dtype=object),
                "reward_model": np.array([{"ground_truth": str(float(scores[i]))}], dtype=object),
            },
        )
        result = manager.loop.run_until_complete(manager.run_single(data))
        output = AgentLoopOutput(
            prompt_ids=prompt.tolist(),
            response_ids=response.tolist(),
            response_mask=[1] * len(response),
            reward_score=result["reward_score"],
            metrics=AgentLoopMetrics(),
            extra_fields={"reward_extra_info": result["reward_extra_info"]},
        )
        outputs.append(output.as_dict())
    stored = tu.list_of_dict_to_tensordict(outputs)
    for name in ("rm_scores", "extra_fields"):
        rows[name] = stored[name]
    return rows


def process_hand_formula(
    ids: list[torch.Tensor], scores: torch.Tensor, group: int, outcome_weight: float
) -> list[torch.Tensor]:
    """``process`` written out (tests/helpers/process_formula.py) on verl's GRPO advantage of
    the scores (eps 1e-6)."""
    steps = [step_spans(row.tolist()) for row in ids]
    rows = process_advantages(
        steps, scores.tolist(), [len(r) for r in ids], group, outcome_weight, outcome_eps=1e-6
    )
    return [torch.tensor(row, dtype=torch.float32) for row in rows]


def test_process_reads_a_compute_scores_step_rewards_as_verl_stores_them(
    transfer_queue: None,
) -> None:
    """``credit: process`` on verl's own path: a ``compute_score`` returning ``{"score": R,
    "step_rewards": [...]}`` scored by verl's reward manager and stored by its agent loop,
    then the credit trainer's ``_compute_advantage`` (verl's GRPO, then the credit): the
    stored advantages are the hand formula, and vary within a response."""
    config = smoke_config("actor_rollout_ref.rollout.n=2")
    config.algorithm.credit = {"name": "process", "outcome_weight": 0.5}
    trainer = get_trainer_cls(config.trainer.v1.trainer_mode)(config=config)
    assert trainer.work_request is None  # no engine signal: nothing asked of the actor
    scores = torch.tensor([1.0, 0.0, 0.25, 0.75])
    rows = scored_rows(v1_batch(PROMPTS, RESPONSES, 50), scores)
    rows["uid"] = torch.tensor([0, 0, 1, 1])
    keys = [f"process_{i}_0" for i in range(len(PROMPTS))]
    batch = tq.kv_batch_put(keys=keys, partition_id="train", fields=rows)

    metrics: dict[str, Any] = {}
    trainer._compute_advantage(batch, metrics)
    stored = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["advantages"])

    ids = list(rows["responses"].unbind())
    expected = process_hand_formula(ids, scores, 2, 0.5)
    for got, want in zip(stored["advantages"].unbind(), expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert any(bool((row != row[0]).any()) for row in expected)
    assert "credit/weight_max" in metrics


def test_under_gae_process_gives_verls_critic_the_step_rewards_as_given(
    models: tuple[Path, Path], transfer_queue: None
) -> None:
    """docs/design.md, "Credit under a critic": with ``process``'s defaults verl's GAE
    reads the compute_score's step rewards at their steps' last tokens in place of the
    outcome (stock scores + D), and the stored scores are put back."""
    policy, rm = models
    config = gae_config("process", False, policy, rm)
    trainer = get_trainer_cls(config.trainer.v1.trainer_mode)(config=config)
    scores = torch.tensor([1.0, 0.0, 0.25, 0.75])
    rows = scored_rows(v1_batch(PROMPTS, RESPONSES, 50), scores)
    rows["uid"] = torch.tensor([0, 0, 1, 1])
    gen = torch.Generator().manual_seed(5)
    rows["values"] = nested([torch.randn(r, generator=gen) for r in RESPONSES])
    keys = [f"gae_process_{i}_0" for i in range(len(PROMPTS))]
    batch = tq.kv_batch_put(keys=keys, partition_id="train", fields=rows)

    trainer._compute_advantage(batch, {})
    names = ["advantages", "returns", "rm_scores"]
    stored = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=names)

    mask = rows["response_mask"].to_padded_tensor(0).bool()
    given = torch.zeros(mask.shape)
    for b, ids in enumerate(rows["responses"].unbind()):
        for _, end, r in step_spans(ids.tolist()):
            given[b, end - 1] = r
    values = rows["values"].to_padded_tensor(0.0)
    gamma, lam = config.algorithm.gamma, config.algorithm.lam
    want_adv, want_ret = compute_gae_advantage_return(given, values, mask.float(), gamma, lam)
    stored = stored.to_padded_tensor()
    torch.testing.assert_close(stored["advantages"][mask], want_adv[mask])
    torch.testing.assert_close(stored["returns"][mask], want_ret[mask])
    assert torch.equal(stored["rm_scores"], rows["rm_scores"].to_padded_tensor(0.0))
