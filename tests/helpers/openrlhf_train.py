"""Tiny CPU stand-ins for the Ray actors OpenRLHF's ``train_ppo_ray.train(args)`` builds, so
that its own ``train`` runs on a CPU, in its own order (trainer created, then the models
loaded, then ``fit``).

What is swapped, and where ``train_ppo_ray`` looks it up (``swap_in_tiny_actors``):

- ``openrlhf.trainer.ray.ppo_actor.PolicyModelActor`` -> ``TinyPolicyActor``: OpenRLHF's own
  ``PolicyModelActor.forward`` and ``BaseModelActor.execute_batch`` around an OpenRLHF
  ``Actor`` loaded from the run's ``--actor.model_name_or_path`` as OpenRLHF loads it (its
  ``--ds.param_dtype``, ``--ds.attn_implementation``, temperature, packing), without a
  DeepSpeed engine; ``fit`` takes one plain policy-gradient SGD step on the appended
  experiences and records what it was given; ``save_model`` writes that record to
  ``<--ckpt.output_dir>/tiny_policy.json``.
- ``openrlhf.trainer.ray.launcher.RewardModelActor`` -> ``TinyRewardActor``: OpenRLHF's own
  ``RewardModelActor.forward`` around the ``RewardModel`` its
  ``get_llm_for_sequence_regression`` loads from ``--reward.model_name_or_path`` (its
  arguments as ``RewardModelActor`` passes them), without a DeepSpeed engine.
- ``openrlhf.trainer.ray.create_vllm_engines`` -> ``tiny_vllm_engines``: ``TinyEngine``
  actors whose ``generate_responses`` is OpenRLHF's ``SingleTurnAgentExecutor.execute`` with
  the engine's ``generate`` sampling from the policy checkpoint with Hugging Face
  ``generate`` (the policy's weights pushed to it by ``broadcast_to_vllm`` after each step).

Each model actor points ``torch.cuda.current_device`` at the CPU in its own process (the
stock ``forward`` methods ask for it). Nothing else of OpenRLHF is replaced: its parser,
``get_strategy``, ``RayActorGroup``, ``PPOTrainer`` (dataset, tokenizer, samples generator,
experience maker, ``fit`` loop) run as they are.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import ray
import torch
from openrlhf.trainer.ray.launcher import BaseModelActor, RewardModelActor
from openrlhf.trainer.ray.ppo_actor import PolicyModelActor

from tests.helpers.openrlhf_stubs import install_openrlhf_stubs

install_openrlhf_stubs()

#: Where ``TinyPolicyActor.save_model`` writes what it was given, in ``--ckpt.output_dir``.
RECORD_FILE = "tiny_policy.json"


def _cpu_device() -> None:
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]  # this worker's "GPU"


@ray.remote(num_gpus=1)
class TinyPolicyActor(BaseModelActor):  # type: ignore[misc]
    forward = PolicyModelActor.__ray_metadata__.modified_class.forward

    def init_model_from_pretrained(
        self, strategy: Any, pretrain: str, max_steps: Any = None, vllm_engines: Any = None
    ) -> None:
        from openrlhf.models import Actor

        _cpu_device()
        args = strategy.args
        self.strategy = strategy
        self.vllm_engines = vllm_engines or []
        self.actor = Actor(
            pretrain,
            attn_implementation=args.ds.attn_implementation,
            param_dtype=args.ds.param_dtype,
            packing_samples=args.ds.packing_samples,
            temperature=args.rollout.temperature,
        )
        self.optimizer = torch.optim.SGD(self.actor.parameters(), lr=args.actor.adam.lr)
        self.buffer: list[Any] = []
        self.steps: list[dict[str, Any]] = []

    def append(self, experience: Any) -> None:
        self.buffer.append(experience)

    def fit(self, kl_ctl: float = 0) -> dict[str, float]:
        """One SGD step on -sum(advantages * log-probs) over the action tokens of the
        appended micro-batches; records each one's advantages and info."""
        self.actor.train()
        self.optimizer.zero_grad()
        tokens = sum(int(e.action_mask.sum()) for e in self.buffer)
        loss = torch.zeros(())
        for e in self.buffer:
            log_probs = self.actor(e.sequences, e.action_mask, e.attention_mask)
            mask = e.action_mask.float()
            loss = loss - (e.advantages.float() * log_probs.float() * mask).sum() / tokens
        loss.backward()
        self.optimizer.step()
        info = {
            key: float(torch.cat([e.info[key].float() for e in self.buffer]).mean())
            for key in self.buffer[0].info
        }
        self.steps.append(
            {
                "advantages": [e.advantages.tolist() for e in self.buffer],
                "action_mask": [e.action_mask.tolist() for e in self.buffer],
                "info": info,
            }
        )
        self.buffer = []
        return {"policy_loss": float(loss), **info}

    def broadcast_to_vllm(self) -> None:
        state = {k: v.detach().float().cpu() for k, v in self.actor.model.state_dict().items()}
        ray.get([engine.load_weights.remote(state) for engine in self.vllm_engines])

    def save_model(self) -> None:
        folder = Path(self.strategy.args.ckpt.output_dir)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / RECORD_FILE).write_text(json.dumps({"pid": os.getpid(), "steps": self.steps}))


@ray.remote(num_gpus=1)
class TinyRewardActor(BaseModelActor):  # type: ignore[misc]
    forward = RewardModelActor.__ray_metadata__.modified_class.forward

    def init_model_from_pretrained(self, strategy: Any, pretrain: str) -> None:
        from openrlhf.models import get_llm_for_sequence_regression

        _cpu_device()
        args = strategy.args
        self.strategy = strategy
        self.model = get_llm_for_sequence_regression(
            pretrain,
            "reward",
            normalize_reward=args.reward.normalize_enable,
            attn_implementation=args.ds.attn_implementation,
            param_dtype=args.ds.param_dtype,
            value_head_prefix=args.ds.value_head_prefix,
            packing_samples=args.ds.packing_samples,
        )
        self.model.eval()


@ray.remote
class TinyEngine:
    """A vLLM engine's ``generate_responses`` (OpenRLHF's single-turn executor) on a Hugging
    Face causal LM sampling on the CPU."""

    def __init__(self, pretrain: str, seed: int) -> None:
        from openrlhf.utils.agent import SingleTurnAgentExecutor
        from transformers import AutoModelForCausalLM

        torch.manual_seed(seed)
        self.model = AutoModelForCausalLM.from_pretrained(pretrain, dtype=torch.float32).eval()
        self.executor = SingleTurnAgentExecutor()

    def get_num_unfinished_requests(self) -> int:
        return 0

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state)

    async def generate_responses(
        self,
        prompt: str,
        label: str,
        sampling_params: Any,
        max_length: int,
        hf_tokenizer: Any,
        num_samples: int = 1,
        images: Any = None,
    ) -> list[dict[str, Any]]:
        return [
            await self.executor.execute(
                prompt=prompt,
                label=label,
                sampling_params=sampling_params,
                max_length=max_length,
                hf_tokenizer=hf_tokenizer,
                llm_engine=self,
                images=images,
            )
            for _ in range(num_samples)
        ]

    async def generate(
        self, prompt_token_ids: list[int], sampling_params: Any, multi_modal_data: Any = None
    ) -> Any:
        """vLLM's ``RequestOutput`` as the executor reads it: ``outputs[0].token_ids`` and
        ``finish_reason``."""
        ids = torch.tensor([prompt_token_ids])
        config = self.model.generation_config
        with torch.no_grad():
            out = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=sampling_params.temperature,
                top_p=sampling_params.top_p,
                top_k=0,
                max_new_tokens=sampling_params.max_tokens,
                min_new_tokens=sampling_params.min_tokens,
                pad_token_id=config.pad_token_id,
                eos_token_id=config.eos_token_id,
            )
        tokens = out[0, ids.shape[1] :].tolist()
        finish = "length" if len(tokens) >= sampling_params.max_tokens else "stop"
        return SimpleNamespace(
            outputs=[SimpleNamespace(token_ids=tokens, finish_reason=finish, logprobs=None)]
        )


def tiny_vllm_engines(
    num_engines: int, tensor_parallel_size: int, pretrain: str, seed: int, *_: Any, **__: Any
) -> list[Any]:
    """``create_vllm_engines``' place: ``num_engines`` ``TinyEngine`` actors (no GPU)."""
    return [TinyEngine.remote(pretrain, seed + i) for i in range(num_engines)]


def swap_in_tiny_actors(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``train_ppo_ray`` (imported afresh when run as ``__main__``) build the tiny actors
    (module docstring)."""
    import openrlhf.trainer.ray as ray_package
    import openrlhf.trainer.ray.launcher as launcher
    import openrlhf.trainer.ray.ppo_actor as ppo_actor

    monkeypatch.setattr(ppo_actor, "PolicyModelActor", TinyPolicyActor)
    monkeypatch.setattr(launcher, "RewardModelActor", TinyRewardActor)
    monkeypatch.setattr(ray_package, "create_vllm_engines", tiny_vllm_engines)


def write_tiny_run(folder: Path, prompts: list[str]) -> dict[str, Path]:
    """A policy checkpoint (tiny qwen2 + byte-level BPE tokenizer), a reward model (tiny
    llama sequence classifier, same tokenizer) and a JSONL prompt set (key ``input``) under
    ``folder``; their paths by name ``policy``, ``reward``, ``prompts``."""
    from adapters.tiny import tiny_causal_lm, tiny_seq_classifier, train_bpe_tokenizer

    tokenizer = train_bpe_tokenizer(vocab_size=300)
    vocab = len(tokenizer)
    paths = {"policy": folder / "policy", "reward": folder / "reward"}
    tiny_causal_lm(
        "qwen2",
        vocab,
        seed=5,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    ).save_pretrained(paths["policy"])
    tiny_seq_classifier(
        "llama", vocab, hidden=16, seed=6, pad_token_id=tokenizer.pad_token_id
    ).save_pretrained(paths["reward"])
    for path in paths.values():
        tokenizer.save_pretrained(path)
    paths["prompts"] = folder / "prompts.jsonl"
    paths["prompts"].write_text("".join(json.dumps({"input": p}) + "\n" for p in prompts))
    return paths
