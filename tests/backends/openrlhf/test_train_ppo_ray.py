"""``credit-openrlhf`` through OpenRLHF's own ``train_ppo_ray.train(args)``, in its order.

``train`` creates the trainer actor (``PPOTrainer.remote``, where token credit is installed)
*before* it loads the policy and reward models (``async_init_model_from_pretrained``), then
calls ``fit``. The run here goes through the launcher's entry point (``main``: credit flags
split off, ``train_ppo_ray`` run as ``__main__``, its parser, ``get_strategy``,
``RayActorGroup``, the real ``PPOTrainer`` with its dataset, tokenizer, samples generator and
experience maker) on a local Ray cluster with fake GPU resources. Only the actor classes
``train`` builds are swapped, where it looks them up, for tiny CPU actors
(``tests.helpers.openrlhf_train``: OpenRLHF's own ``forward`` methods around its ``Actor``
and ``RewardModel`` loaded from tiny checkpoints as OpenRLHF loads them, without the
DeepSpeed engines and process group that ``strategy.setup_distributed`` / ``prepare`` build
with CUDA and NCCL; a Hugging Face sampler behind OpenRLHF's single-turn executor in place of
vLLM, which needs CUDA). Nothing else is patched.

At the commit before the fix, both runs died at start-up inside ``PPOTrainer.remote``:
``RayTaskError(AttributeError): 'TinyRewardActor' object has no attribute 'model'`` from
``export_reward_embedding`` (datc) and ``one_pass_null`` (p2t), called by the install.

The one-pass path (no ``--credit.direction.*``: the direction model is OpenRLHF's reward
model on its actors) is the headline use: ``datc`` and ``p2t`` must train two steps.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from backends.openrlhf.launcher import main
from tests.helpers.openrlhf_train import RECORD_FILE, swap_in_tiny_actors, write_tiny_run
from tests.helpers.paths import TESTS

pytestmark = pytest.mark.slow

PROMPTS = ["The cat sat on", "A quick brown fox", "Good answers are", "The weather today"]


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    """Local Ray with two fake GPUs (policy and reward-model actors); the workers import the
    project and the test stubs of flash_attn and vllm."""
    import ray

    path = os.pathsep.join([str(TESTS / "stubs"), str(TESTS), str(TESTS.parent)])
    ray.init(
        num_cpus=4,
        num_gpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={
            "env_vars": {"PYTHONPATH": path, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
        },
    )
    yield ray
    ray.shutdown()


def train_ppo_ray_flags(paths: dict[str, Path], out: Path) -> list[str]:
    """GRPO with OpenRLHF's reward model: 4 prompts, 2 per step, 2 samples each, micro-batches
    of 2, one policy and one reward-model actor, one (tiny) rollout engine: 2 steps."""
    return [
        "--actor.model_name_or_path", str(paths["policy"]),
        "--reward.model_name_or_path", str(paths["reward"]),
        "--data.prompt_dataset", str(paths["prompts"]),
        "--data.input_key", "input",
        "--actor.num_nodes", "1", "--actor.num_gpus_per_node", "1",
        "--reward.num_nodes", "1", "--reward.num_gpus_per_node", "1",
        "--vllm.num_engines", "1",
        "--algo.advantage.estimator", "group_norm",
        "--algo.kl.init_coef", "0",
        "--rollout.n_samples_per_prompt", "2",
        "--rollout.batch_size", "2",
        "--rollout.micro_batch_size", "2",
        "--train.batch_size", "4",
        "--train.micro_batch_size", "2",
        "--rollout.max_new_tokens", "6",
        "--data.max_len", "32",
        "--data.max_samples", "4",
        "--actor.adam.lr", "0.05",
        "--ds.attn_implementation", "eager",
        "--ckpt.output_dir", str(out),
        "--ckpt.path", str(out / "ckpt"),
    ]  # fmt: skip


@pytest.mark.parametrize("credit", ["datc", "p2t"])
def test_the_one_pass_path_trains_two_steps_in_train_ppo_rays_own_order(
    ray_cluster: Any,
    credit: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    paths = write_tiny_run(tmp_path, PROMPTS)
    swap_in_tiny_actors(monkeypatch)
    out = tmp_path / "out"

    assert main(["--credit", credit, *train_ppo_ray_flags(paths, out)]) == 0

    assert f"token credit: installed {credit} in PPOTrainer@" in capsys.readouterr().out
    steps = json.loads((out / RECORD_FILE).read_text())["steps"]
    assert len(steps) == 2  # both steps of the data set were trained
    for step in steps:
        info = step["info"]
        assert info["credit/signal_time_s"] > 0.0  # signals were gathered from the actors
        assert info["credit/extra_policy_forwards"] == 0.0  # from OpenRLHF's own forward
        assert info["credit/weight_max"] > info["credit/weight_min"]  # tokens were weighted
        # issue 46: the direction model is the reward here, said so instead of an agreement
        assert info["credit/direction_is_reward"] == 1.0
        assert "credit/direction_agreement" not in info
        for advantages, mask in zip(step["advantages"], step["action_mask"], strict=True):
            adv, on = torch.tensor(advantages), torch.tensor(mask).bool()
            assert float(adv[~on].abs().sum()) == 0.0  # credit only on the action tokens
