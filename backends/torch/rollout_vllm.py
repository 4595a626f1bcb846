"""Optional vLLM rollout engine (``rollout.engine: vllm``), for GPU runs.

vLLM is imported only when this engine is built; without it the trainer says how to install
it. Each rank runs its own in-process engine on its own GPU, as TRL's colocate mode does:
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` is set before the engine is built, so ``collective_rpc``
reaches the worker in this process (no weights shipped to a subprocess), and under torchrun
the engine joins the launcher's ranks (``distributed_executor_backend="external_launcher"``)
instead of starting its own executor, which would put every rank's engine on GPU 0.
Weights are pushed from the training model through a worker extension before a rollout,
whenever they changed since the last push.

Sampling matches the HF engine: temperature, top-k and top-p from the rollout config (off by
default), passed explicitly, no penalties; every request carries its own seed
(``derive_seed``), so samples do not depend on how prompts are spread over ranks. The
old-policy log-probs and DATC's policy statistics are recomputed by the training model, as
in OpenRLHF.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from backends.common.errors import ConfigError
from backends.common.response_mask import response_mask_from_eos
from backends.torch.config import RolloutConfig
from backends.torch.distributed import unwrap
from backends.torch.rollout import RolloutBatch, derive_seed


class WeightSyncExtension:
    """vLLM worker extension: ``collective_rpc("load_policy_weights", args=(weights,))``."""

    model_runner: Any

    def load_policy_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        self.model_runner.model.load_weights(weights=weights)


class VLLMRolloutEngine:
    """Samples with a vLLM ``LLM`` built from the policy's model folder."""

    def __init__(
        self,
        model_path: str,
        cfg: RolloutConfig,
        *,
        dtype: str,
        pad_id: int,
        eos_ids: Sequence[int],
        seed: int,
    ) -> None:
        try:
            from vllm import LLM
        except ImportError as exc:
            raise RuntimeError(
                "rollout.engine: 'vllm' needs the vllm package on a CUDA machine "
                "(pip install 'token-credit[vllm]'); use rollout.engine: hf otherwise"
            ) from exc
        self.cfg = cfg
        self.pad_id = pad_id
        self.eos_ids = list(eos_ids)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process
        launcher: dict[str, Any] = {}
        if dist.is_initialized():  # torchrun: one engine per rank, on the rank's own GPU
            if cfg.vllm.tensor_parallel_size != 1:
                raise ConfigError(
                    "rollout.vllm.tensor_parallel_size: expected 1 under torchrun (each rank's "
                    f"engine samples its own prompts), got {cfg.vllm.tensor_parallel_size}"
                )
            launcher["distributed_executor_backend"] = "external_launcher"
        self.llm = LLM(
            **launcher,
            model=model_path,
            dtype=dtype,
            seed=seed,
            gpu_memory_utilization=cfg.vllm.gpu_memory_utilization,
            tensor_parallel_size=cfg.vllm.tensor_parallel_size,
            enforce_eager=cfg.vllm.enforce_eager,
            enable_prefix_caching=False,
            worker_extension_cls=f"{__name__}.WeightSyncExtension",
        )

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Copy the training model's current weights into the engine (collective under FSDP:
        every rank gathers the full tensors for its own engine)."""
        state = unwrap(model).state_dict()  # PolicyModule: keys "module.<HF name>"
        weights = [
            (k.removeprefix("module."), v.full_tensor() if hasattr(v, "full_tensor") else v)
            for k, v in ((k, v.detach()) for k, v in state.items())
        ]
        self.llm.collective_rpc("load_policy_weights", args=(weights,))

    def generate(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        group: torch.Tensor,
        *,
        group_size: int,
        greedy: bool,
        seed: int,
    ) -> RolloutBatch:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        prompts = [
            TokensPrompt(prompt_token_ids=ids[mask].tolist())
            for ids, mask in zip(prompt_ids, prompt_mask, strict=True)
        ]
        params = [
            SamplingParams(
                n=group_size,
                temperature=0.0 if greedy else self.cfg.temperature,
                top_k=self.cfg.top_k or -1,  # 0 = off; -1 is off in every vLLM release
                top_p=self.cfg.top_p,
                min_p=0.0,
                repetition_penalty=1.0,
                presence_penalty=0.0,
                frequency_penalty=0.0,
                max_tokens=self.cfg.max_new_tokens,
                seed=derive_seed(seed, row),
            )
            for row in range(len(prompts))
        ]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        responses = [list(o.token_ids) for out in outputs for o in out.outputs]
        R = max(len(r) for r in responses)
        response = torch.full((len(responses), R), self.pad_id, dtype=torch.long)
        for row, tokens in enumerate(responses):
            response[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        response_mask = response_mask_from_eos(response, self.eos_ids)
        response_mask &= torch.arange(R).unsqueeze(0) < torch.tensor(
            [len(r) for r in responses]
        ).unsqueeze(1)
        device = prompt_ids.device
        return RolloutBatch(
            prompt_ids.repeat_interleave(group_size, dim=0),
            prompt_mask.repeat_interleave(group_size, dim=0),
            torch.where(response_mask, response, self.pad_id).to(device),
            response_mask.to(device),
            group.repeat_interleave(group_size),
            self.pad_id,
        ).select(slice(None))
