"""verl's ``main_ppo`` in its own order with ``algorithm.credit=datc``, on the CPU, as far as
verl 0.9.1 runs there.

The run starts at ``credit-verl``'s own entry (``backends.verl.cli.main``) with the GPU smoke
run's overrides (``scripts/verl_gpu_smoke.sh``, its models and data written by its own
setup): the config is composed and checked, the plugin named, and verl's Hydra
``main_ppo.main`` runs ``auto_set_device``, ``validate_config`` and ``run_ppo``, which starts
Ray from ``ray_kwargs`` and hands the config to the task runner. ``TaskRunnerV1.run`` is
verl's own code in verl's order, run in this process instead of a Ray actor (the undecorated
class behind a ``.remote()`` stand-in) so that its trainer can be inspected:
``get_trainer_cls(trainer.v1.trainer_mode)`` (the credit trainer, registered by the plugin),
TransferQueue's ``tq.init``, the trainer built on the resolved config, then
``trainer.init()``: tokenizer, train and validation dataloaders (the parquet file), dump
executor, role-to-worker mapping, resource pools; then the worker groups.

What blocks the rest on a machine without a GPU, so the run stops where verl builds its
first worker group (``RayWorkerGroup``, replaced by a stand-in that records what verl asked
for and raises ``WorkersReachedError``):

1. the worker group's actors cannot be placed (measured with verl 0.9.1 and Ray 2.55 on this
   CPU machine, Ray told of one logical GPU): ``RayClassWithInitArgs.__call__`` asks the
   platform for the actor's accelerator options, which the CPU platform (resource name
   ``CPU``) gives as ``{"resources": {"CPU": n}}`` and Ray refuses ("Use the 'num_cpus' and
   'num_gpus' keyword instead of 'CPU' and 'GPU'"); given as ``{"num_gpus": n}`` instead,
   the request ``{'GPU': 1/3, 'CPU': 1}`` fits none of the pool's placement-group bundles
   ``[{'CPU': 1.0}]``. Past placement, verl's workers (``ActorRolloutRefWorker``) set up their
   process group in ``initialize_global_process_group_ray``, which failed with
   ``use_gpu=False`` on the CPU (``cpu:gloo,cpu:gloo``, /work/shared/ENVIRONMENT.md); and
   ``CreditFSDPEngine`` is registered for (cuda, nvidia) only, so a CPU worker would build
   verl's own engine;
2. after the workers, ``LLMServerManager`` starts the rollout replicas, which verl's V1
   trainer has for vllm, sglang and trtllm only (``RolloutReplicaRegistry``), none of which
   installs without CUDA; V1 has no Hugging Face rollout.

What the workers then do with the credit (the engine's old-log-prob forward with W0, verl's
``train_batch``) and the trainer's two credit steps on TransferQueue are tested on verl's real
engine in test_engine.py and test_trainer.py; scripts/verl_gpu_smoke.sh runs the whole.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

pytest.importorskip("verl", reason="the verl tests run in .venv-verl (make verl)")

import ray
import verl.trainer.ppo.v1.trainer_base as trainer_base
from verl.trainer import main_ppo
from verl.trainer.ppo.utils import Role
from verl.workers.engine_workers import ActorRolloutRefWorker

from backends.verl.cli import main
from backends.verl.trainer import CreditPPOTrainer
from tests.backends.verl.test_gpu_smoke import settings, write_setup

#: verl's task runner (a Ray actor class), before the tests put ``LocalTaskRunner`` in its place
TASK_RUNNER = main_ppo.TaskRunnerV1


class WorkersReachedError(Exception):
    """Raised where verl builds its first worker group (what blocks the rest: module doc)."""


class LocalTaskRunner:
    """``main_ppo``'s ``task_runner_class``: ``.remote()`` makes verl's own ``TaskRunnerV1``
    (the class Ray decorated) in this process, and ``runner.run.remote(config)`` calls its
    ``run``, returning an object reference for ``run_ppo``'s ``ray.get``."""

    runners: ClassVar[list[Any]] = []

    @classmethod
    def remote(cls) -> Any:
        runner = TASK_RUNNER.__ray_metadata__.modified_class()
        cls.runners.append(runner)
        return SimpleNamespace(run=SimpleNamespace(remote=lambda c: ray.put(runner.run(c))))


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[dict[str, Any]]:
    """What verl asked of its worker groups (the stand-in's calls), with main_ppo's task
    runner in this process; the environment, working folder (Hydra's) and Ray restored."""
    calls: list[dict[str, Any]] = []

    def worker_group(**kwargs: Any) -> Any:
        calls.append(kwargs)
        raise WorkersReachedError

    monkeypatch.setattr(trainer_base, "RayWorkerGroup", worker_group)
    monkeypatch.setattr(main_ppo, "TaskRunnerV1", LocalTaskRunner)
    monkeypatch.setattr(LocalTaskRunner, "runners", [])
    monkeypatch.setenv("VERL_USE_EXTERNAL_MODULES", os.environ["VERL_USE_EXTERNAL_MODULES"])
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")  # Hydra re-raises instead of exiting
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.chdir(tmp_path)
    yield calls
    if ray.is_initialized():
        ray.shutdown()


def test_main_ppo_builds_the_credit_trainer_in_its_task_runner_up_to_the_workers(
    tmp_path: Path, asked: list[dict[str, Any]]
) -> None:
    work = tmp_path / "work"
    write_setup(work)
    found = settings(str(work))
    cpu = [
        "ray_kwargs.ray_init.num_cpus=8",
        "+ray_kwargs.ray_init.num_gpus=1",
        "+ray_kwargs.ray_init.include_dashboard=false",
        # verl's 8 storage actors, one CPU each, would leave none for the controller
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    ]
    with pytest.raises(WorkersReachedError):
        main([*found["VERL_COMMON"], *found["VERL_DATC"], *cpu, "--debug"])

    (runner,) = LocalTaskRunner.runners
    trainer = runner.trainer
    assert type(trainer) is CreditPPOTrainer  # from verl's registry, in the task runner
    assert trainer.trainer_mode == "sync" and trainer.credit.plan.name == "datc"
    assert trainer.work_request is not None
    request = json.loads(trainer.work_request)
    assert request["signals"] == ["unsigned_work"]
    direction = request["direction"]
    assert (direction["kind"], direction["path"]) == ("seq_classification", str(work / "rm"))
    assert len(trainer.train_dataset) == 16 and trainer.total_training_steps == 2
    # verl's own worker class for the policy's role, asked for once, in a GPU pool
    assert set(trainer.role_worker_mapping) == {Role.ActorRollout}
    worker = trainer.role_worker_mapping[Role.ActorRollout]
    assert worker.__ray_metadata__.modified_class.__mro__[1] is ActorRolloutRefWorker
    (call,) = asked
    assert call["resource_pool"].use_gpu
    assert call["device_name"] == runner.config.trainer.device
