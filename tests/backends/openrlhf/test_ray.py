"""The injection mechanism on a real local Ray cluster: the token-credit experience maker is
installed in a live trainer actor (another process), binds its signal methods onto the
actors of OpenRLHF's ``RayActorGroup``, moves the direction model's embedding table from the
reward role to the policy role and gathers the signals through OpenRLHF's own
``async_run_method_batch`` dispatch (the policy-placed one-pass path runs in OpenRLHF's own
order in test_train_ppo_ray.py, its forwards counted in test_forward_capture.py). CPU only:
Ray is given one fake GPU resource, and one model actor plays both the policy and the
reward-model group (to keep to two workers)."""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from adapters.tiny import tiny_causal_lm
from backends.openrlhf.actor_side import ActorSignals, reduce_policy_stats, reward_grad_for_actions
from backends.openrlhf.compat import resolve_credit
from backends.openrlhf.experience_maker import TokenCreditExperienceMaker
from backends.openrlhf.injection import TrainerWithCredit
from backends.openrlhf.settings import OpenRLHFCreditConfig
from credit_core import CreditConfig
from tests.helpers.openrlhf import (
    TinyDirectionModel,
    openrlhf_args,
    ray_test_classes,
    rollout_samples,
)
from tests.helpers.paths import TESTS

pytestmark = pytest.mark.slow

VOCAB, DIM, POLICY_SEED, RM_SEED = 61, 5, 31, 32
PROMPTS = [[3, 4, 5], [3, 4, 5], [6, 7], [6, 7]]
RESPONSES = [[10, 11, 12], [13], [14, 15, 16, 17], [18, 19]]
REWARDS = [1.0, 0.0, 0.5, 2.0]
FLAGS = [
    "--algo.advantage.estimator",
    "group_norm",
    "--rollout.n_samples_per_prompt",
    "2",
    "--rollout.micro_batch_size",
    "2",
    "--algo.kl.use_loss",
    "--reward.model_name_or_path",
    "/not/loaded/the/direction/model/is/given",
]


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    import ray

    path = os.pathsep.join([str(TESTS / "stubs"), str(TESTS), str(TESTS.parent)])
    ray.init(
        num_cpus=2,
        num_gpus=1,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": path, "OMP_NUM_THREADS": "1"}},
    )
    yield ray
    ray.shutdown()


def in_process_gatherer() -> Any:
    """The actor-side functions run here, on models with the workers' seeds."""
    from openrlhf.models import Actor

    actor = Actor(tiny_causal_lm("qwen2", VOCAB, seed=POLICY_SEED))
    actor.packing_samples = False
    rm = TinyDirectionModel(VOCAB, DIM, RM_SEED)

    def gather(experiences: Any) -> list[ActorSignals]:
        out = []
        for e in experiences:
            stats = reduce_policy_stats(
                actor, e.sequences, e.action_mask, e.attention_mask, rm.reward_embedding
            )
            grad, reward = reward_grad_for_actions(rm, e.sequences, e.attention_mask, e.action_mask)
            out.append(ActorSignals(stats, grad, reward))
        return out

    return gather


def test_credit_maker_is_installed_in_the_trainer_actor_and_reaches_the_model_actors(
    ray_cluster: Any,
) -> None:
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
    from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController
    from openrlhf.trainer.ray.launcher import RayActorGroup

    ray = ray_cluster
    TinyTrainer, TinyModelActor = ray_test_classes()
    group = RayActorGroup(1, 1, TinyModelActor, num_gpus_per_actor=1)
    [model_pid] = ray.get(group.async_run_method("init_model", VOCAB, POLICY_SEED))

    args = openrlhf_args(FLAGS)
    cfg = OpenRLHFCreditConfig(
        credit=CreditConfig.parse({"name": "datc", "beta": 2.0}),
        direction={
            "kind": "module",
            "factory": "tests.helpers.openrlhf:tiny_direction_model",
            "factory_kwargs": {"vocab": VOCAB, "dim": DIM, "seed": RM_SEED},
        },
        placement="reward",
    )
    installs: list[str] = []
    strategy = type("Strategy", (), {"args": args})()
    tokenizer = type("Tokenizer", (), {"pad_token_id": 0})()
    trainer = TrainerWithCredit(TinyTrainer, cfg, on_install=installs.append).remote(
        strategy, group, group, tokenizer
    )

    stock = RemoteExperienceMaker(
        None, None, None, None, FixedKLController(0.0), strategy, tokenizer
    )
    batches = stock.split_rollout_samples(rollout_samples(PROMPTS, RESPONSES, REWARDS))
    for exp in batches:
        exp.kl = torch.zeros(exp.action_mask.shape)
    result = ray.get(trainer.credit_round.remote(copy.deepcopy(batches)))

    # Installed inside the live trainer actor, a process other than the driver and the model.
    assert result["maker"] == "TokenCreditExperienceMaker"
    assert result["pid"] not in (os.getpid(), model_pid)
    assert installs == [f"datc in TinyTrainer@{result['pid']}"]

    # The signals came from the model actor: same numbers as the in-process path.
    local = TokenCreditExperienceMaker(
        None,
        None,
        None,
        None,
        FixedKLController(0.0),
        strategy,
        tokenizer,
        credit=resolve_credit(args, cfg),
        gather_signals=in_process_gatherer(),
    ).compute_advantages_and_returns(copy.deepcopy(batches))
    uniform = stock.compute_advantages_and_returns(copy.deepcopy(batches))
    for got, want, plain, info in zip(
        result["advantages"], local, uniform, result["info"], strict=True
    ):
        torch.testing.assert_close(got, want.advantages, rtol=1e-5, atol=1e-6)
        assert not torch.equal(got, plain.advantages)  # credit was applied
        torch.testing.assert_close(
            info["credit/direction_reward"], want.info["credit/direction_reward"]
        )
        assert info["credit/weight_max"].shape == (2,)
        # issue 46: the step's agreement, measured in the trainer actor as in-process
        agreement = info["credit/direction_agreement"]
        assert bool(agreement.isfinite().all())
        torch.testing.assert_close(agreement, want.info["credit/direction_agreement"])
