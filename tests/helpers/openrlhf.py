"""Helpers for the OpenRLHF integration tests (``tests/test_openrlhf_*.py``).

- ``openrlhf_args(argv)``: OpenRLHF's own parsed (hierarchical) arguments for a
  ``train_ppo_ray`` command line, taken from its real argparse parser.
- ``rollout_samples(...)``: single-sample ``Experience`` objects shaped like the ones
  OpenRLHF's ``SamplesGenerator`` makes from vLLM outputs (no padding, ``action_mask`` over
  the shifted sequence), for fabricated batches.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from adapters.direction import DirectionModel, RewardOutput
from tests.helpers.openrlhf_stubs import install_openrlhf_stubs

install_openrlhf_stubs()


class _ArgsCapturedError(Exception):
    def __init__(self, args: Any) -> None:
        super().__init__("captured")
        self.parsed = args


def openrlhf_args(argv: list[str]) -> SimpleNamespace:
    """OpenRLHF 0.11's parsed arguments for ``train_ppo_ray argv`` (nothing is started).

    Runs ``openrlhf.cli.train_ppo_ray`` as ``__main__`` and stops it right after its parser,
    inside ``hierarchize``.
    """
    import openrlhf.utils.config as config_module

    from backends.openrlhf.launcher import run_openrlhf

    original = config_module.hierarchize

    def capture(args: Any) -> Any:
        raise _ArgsCapturedError(original(args))

    config_module.hierarchize = capture
    try:
        run_openrlhf(argv)
    except _ArgsCapturedError as captured:
        return captured.parsed  # type: ignore[no-any-return]
    finally:
        config_module.hierarchize = original
    raise AssertionError("train_ppo_ray did not parse its arguments")


def rollout_samples(
    prompts: list[list[int]],
    responses: list[list[int]],
    rewards: list[float],
) -> list[Any]:
    """One ``Experience`` per (prompt, response) as OpenRLHF's rollout makes it.

    ``sequences`` (1, L) = prompt + response, ``attention_mask`` ones, ``action_mask``
    (1, L - 1) true on the response tokens of the shifted sequence, ``rewards`` (1,).
    """
    from openrlhf.trainer.ppo_utils.experience import Experience

    samples = []
    for prompt, response, reward in zip(prompts, responses, rewards, strict=True):
        tokens = torch.tensor(prompt + response, dtype=torch.long)
        attention = torch.ones(len(tokens), dtype=torch.long)
        action = torch.zeros(len(tokens), dtype=torch.long)
        action[len(prompt) :] = 1
        samples.append(
            Experience(
                sequences=tokens.unsqueeze(0),
                attention_mask=attention.unsqueeze(0),
                action_mask=action[1:].unsqueeze(0),
                rewards=torch.tensor([reward]),
                response_length=torch.tensor([len(response)]),
                truncated=torch.tensor([False]),
                total_length=torch.tensor([float(len(tokens))]),
                prompts=["p"],
                labels=["l"],
                info={"reward": torch.tensor([reward])},
            )
        )
    return samples


def multi_turn_sample(prompt: list[int], turns: list[tuple[list[int], bool]], reward: float) -> Any:
    """A single-sample ``Experience`` whose response is several spans (agent style).

    ``turns`` lists (tokens, is_action): action spans are marked in ``action_mask``,
    observation spans are not.
    """
    from openrlhf.trainer.ppo_utils.experience import Experience

    tokens = list(prompt)
    action = [0] * len(prompt)
    for span, is_action in turns:
        tokens += span
        action += [int(is_action)] * len(span)
    seq = torch.tensor(tokens, dtype=torch.long)
    return Experience(
        sequences=seq.unsqueeze(0),
        attention_mask=torch.ones(1, len(tokens), dtype=torch.long),
        action_mask=torch.tensor(action[1:], dtype=torch.long).unsqueeze(0),
        rewards=torch.tensor([reward]),
        response_length=torch.tensor([len(tokens) - len(prompt)]),
        truncated=torch.tensor([False]),
        total_length=torch.tensor([float(len(tokens))]),
        prompts=["p"],
        labels=["l"],
        info={"reward": torch.tensor([reward])},
    )


class TinyDirectionModel(DirectionModel):
    """A small frozen differentiable reward model in the policy vocabulary.

    R = mean over response tokens of tanh(x_t W + c) . w, where x_t is the token's
    embedding (row of ``reward_embedding``) plus the mean prompt embedding. Implements the
    ``DirectionModel.score`` contract: reward (B,) and its gradient with respect to the
    response tokens' input embeddings (B, R, d), 0 at padding.
    """

    def __init__(self, vocab: int, dim: int = 8, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.reward_embedding = torch.randn(vocab, dim, generator=gen)
        self.W = torch.randn(dim, dim, generator=gen) / dim**0.5
        self.c = torch.randn(dim, generator=gen)
        self.w = torch.randn(dim, generator=gen)
        self.calls = 0

    def score(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        response_ids: torch.Tensor,
        response_mask: torch.Tensor,
        *,
        with_grad: bool,
    ) -> RewardOutput:
        self.calls += 1
        E = self.reward_embedding
        pm = prompt_mask.float().unsqueeze(2)
        rm = response_mask.float().unsqueeze(2)
        context = (E[prompt_ids] * pm).sum(1) / pm.sum(1).clamp_min(1.0)
        x = E[response_ids].clone().requires_grad_(with_grad)
        h = torch.tanh((x + context.unsqueeze(1)) @ self.W + self.c) @ self.w
        rewards = (h * rm.squeeze(2)).sum(1) / rm.squeeze(2).sum(1)
        grad = None
        if with_grad:
            (grad,) = torch.autograd.grad(rewards.sum(), x)
            grad = grad * rm
        return RewardOutput(rewards=rewards.detach(), reward_grad=grad)


def tiny_direction_model(vocab: int, dim: int, seed: int) -> TinyDirectionModel:
    """Factory for ``RewardModelConfig(kind="module", factory="tests.helpers.openrlhf:...")``."""
    return TinyDirectionModel(vocab, dim, seed)


def ray_test_classes() -> tuple[Any, Any]:
    """(TinyTrainer, TinyModelActor): Ray actor classes built on OpenRLHF's own bases.

    ``TinyTrainer`` is OpenRLHF's ``BasePPOTrainer`` (which creates the stock
    ``RemoteExperienceMaker``) with a ``credit_round`` method running
    ``compute_advantages_and_returns`` and an ``experience_round`` method running
    ``make_experience`` (the policy's log-prob forward) first; ``TinyModelActor`` is a
    ``BaseModelActor`` (so it has OpenRLHF's ``execute_batch``) holding an OpenRLHF ``Actor``
    around a tiny policy, with OpenRLHF's own ``PolicyModelActor.forward`` (its CUDA device
    lookup pointed at the CPU in that worker) and a count of the policy model's forwards.
    """
    import os

    import ray
    from openrlhf.models import Actor
    from openrlhf.trainer.ppo_trainer import BasePPOTrainer
    from openrlhf.trainer.ray.launcher import BaseModelActor
    from openrlhf.trainer.ray.ppo_actor import PolicyModelActor

    from adapters.tiny import tiny_causal_lm

    @ray.remote
    class TinyTrainer(BasePPOTrainer):  # type: ignore[misc]
        def __init__(
            self, strategy: Any, actor_group: Any, reward_group: Any, tokenizer: Any
        ) -> None:
            super().__init__(strategy, actor_group, None, reward_group, None, None, tokenizer)

        def credit_round(self, experiences: list[Any]) -> dict[str, Any]:
            out = self.experience_maker.compute_advantages_and_returns(experiences)
            return {
                "pid": os.getpid(),
                "maker": type(self.experience_maker).__name__,
                "advantages": [e.advantages for e in out],
                "info": [e.info for e in out],
            }

        def experience_round(self, samples: list[Any]) -> dict[str, Any]:
            experiences = self.experience_maker.make_experience(samples)
            return self.credit_round(experiences)

    @ray.remote(num_gpus=1)
    class TinyModelActor(BaseModelActor):  # type: ignore[misc]
        forward = PolicyModelActor.__ray_metadata__.modified_class.forward

        def init_model(self, vocab: int, seed: int) -> int:
            torch.cuda.current_device = lambda: "cpu"  # this CPU test worker's "GPU"
            self.strategy = SimpleNamespace(ring_attn_group=None, is_rank_0=lambda: True)
            self.actor = Actor(tiny_causal_lm("qwen2", vocab, seed=seed))
            self.actor.packing_samples = False
            self.forwards = 0
            self.actor.model.register_forward_pre_hook(self._count_forward)
            return os.getpid()

        def _count_forward(self, *_: Any) -> None:
            self.forwards += 1

        def forward_count(self) -> int:
            return int(self.forwards)

    return TinyTrainer, TinyModelActor
