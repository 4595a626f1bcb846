"""``CreditPPOTrainer`` as verl builds it: picked by verl's trainer registry from
``trainer.v1.trainer_mode``, constructed on verl's composed config (no Ray needed for
that), then verl's synchronous trainer in every respect verl's own code checks."""

from __future__ import annotations

import pytest

pytest.importorskip("verl", reason="the verl tests run in .venv-verl (make verl)")

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ray
import torch
import transfer_queue as tq
from omegaconf import OmegaConf
from tensordict import TensorDict
from verl.trainer.ppo.v1 import get_trainer_cls
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
from verl.utils import tensordict_utils as tu
from verl.workers.utils.padding import response_from_nested

from backends.verl.cli import checked_config, verl_overrides
from backends.verl.config import TRAINER_MODE
from backends.verl.credit import response_advantages
from backends.verl.engine import WORK_FIELD, WORK_REQUEST_KEY, CreditFSDPEngine
from backends.verl.trainer import CreditPPOTrainer
from credit_core import CreditError, CreditSignals, assign_credit, get_strategy
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


def smoke_config(*extra: str):
    found = settings()
    overrides = verl_overrides([*found["VERL_COMMON"], *found["VERL_DATC"], *extra])
    config = checked_config([*overrides, f"trainer.v1.trainer_mode={TRAINER_MODE}"])
    OmegaConf.resolve(config)  # as verl's TaskRunner does before building the trainer
    return config


def test_verl_builds_the_credit_trainer_as_its_sync_trainer() -> None:
    config = smoke_config()
    trainer = get_trainer_cls(config.trainer.v1.trainer_mode)(config=config)
    assert type(trainer) is CreditPPOTrainer
    assert trainer.trainer_mode == "sync" and type(trainer.replay_buffer) is ReplayBuffer
    assert trainer.credit.plan.name == "datc" and trainer.work_request is not None
    assert trainer.credit.plan.strategy.name == "datc"


def test_a_bad_credit_key_stops_the_trainer_before_any_worker() -> None:
    config = smoke_config()
    config.algorithm.credit = "saliency"
    with pytest.raises(CreditError, match="'saliency' is not served"):
        CreditPPOTrainer(config=config)


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
    for the old-log-prob forward only (no other policy forward: one per micro-batch), and the
    stored advantages are DATC's token advantages of verl's GRPO advantage and the engine's
    W0."""
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
