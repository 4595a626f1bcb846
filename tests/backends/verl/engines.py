"""verl's real FSDP2 engine on the CPU for the tests: built, fed an old-log-prob batch in
verl's V1 layout, run with its policy forwards counted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tensordict import TensorDict
from verl.trainer.config import CheckpointConfig
from verl.utils import tensordict_utils as tu
from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig

from backends.verl.engine import WORK_REQUEST_KEY
from tests.backends.verl.layouts import v1_batch

PROMPTS = [3, 5, 4, 2]
RESPONSES = [6, 1, 4, 3]
TEMPERATURE = 0.7
MICRO_BATCH = 2


def build_engine(cls: type, policy: Path, packed: bool, param_dtype: str = "fp32") -> Any:
    """verl's FSDP2 engine class ``cls`` on ``policy``, fp32 throughout (verl's default
    computes in bf16; ``param_dtype="bf16"``: verl's default mixed precision, bf16 compute
    under verl's bf16 autocast, fp32 master weights), with SDPA attention (transformers'
    SDPA keeps packed sequences apart by their position ids: flash-attention has no CPU
    kernel); ``packed``: verl's ``use_remove_padding`` layout (its default), else the
    padded one."""
    model = HFModelConfig(
        path=str(policy), use_remove_padding=packed, override_config={"attn_implementation": "sdpa"}
    )
    precision = {"param_dtype": param_dtype, "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    engine_config = FSDPEngineConfig(
        strategy="fsdp2", model_dtype="fp32", mixed_precision=precision
    )
    engine_config.use_remove_padding = packed
    engine_config.infer_micro_batch_size_per_gpu = MICRO_BATCH
    engine_config.micro_batch_size_per_gpu = MICRO_BATCH
    engine = cls(
        model_config=model,
        engine_config=engine_config,
        optimizer_config=FSDPOptimizerConfig(lr=1e-3),
        checkpoint_config=CheckpointConfig(),
    )
    engine.initialize()
    return engine


def old_log_prob_batch(
    engine: Any,
    work_request: str | None,
    dynamic: bool = False,
    temperature: float = TEMPERATURE,
) -> TensorDict:
    """The old-log-prob batch as verl's trainer sends it (``calculate_entropy``, no loss);
    ``dynamic``: verl's dynamic batch size, micro-batches of at most 16 tokens (rows
    regrouped by length, outputs put back in order by verl)."""
    batch = v1_batch(PROMPTS, RESPONSES, engine.model_config.hf_config.vocab_size)
    tu.assign_non_tensor(
        batch,
        calculate_entropy=True,
        compute_loss=False,
        temperature=temperature,
        use_remove_padding=engine.engine_config.use_remove_padding,
        use_dynamic_bsz=dynamic,
        micro_batch_size_per_gpu=MICRO_BATCH,
        max_token_len_per_gpu=16 if dynamic else 4096,
        use_fused_kernels=False,
    )
    if work_request is not None:
        tu.assign_non_tensor(batch, **{WORK_REQUEST_KEY: work_request})
    return batch


def infer(engine: Any, batch: TensorDict) -> tuple[dict[str, Any], int]:
    """The engine's ``infer_batch`` model output and the number of policy forwards it ran."""
    calls = []
    hook = engine.module.register_forward_hook(lambda *_: calls.append(1))
    try:
        with engine.eval_mode():
            out = engine.infer_batch(batch, loss_function=None)
    finally:
        hook.remove()
    return out["model_output"], len(calls)


def work_request(
    rm: Path,
    points: int = 0,
    signals: tuple[str, ...] = ("unsigned_work",),
    scores: bool = False,
) -> str:
    """The trainer's request (``backends.verl.config.work_request``) for ``signals`` (W0 by
    default) with the tiny RM as the direction model; ``points`` >= 1 takes its gradient on
    the path (datc_mid, datc_ig); ``scores``: the direction model's score of each response
    too (the trainer's measure of its agreement with the reward)."""
    direction = {"kind": "seq_classification", "path": str(rm)}
    request = {"signals": sorted(signals), "direction": direction, "chunk_size": 64}
    return json.dumps({**request, "points": points, **({"scores": True} if scores else {})})
