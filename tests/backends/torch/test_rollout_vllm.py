"""The vLLM rollout engine's construction, with a stand-in ``vllm.LLM`` (vLLM needs CUDA)."""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from transformers import AutoModelForCausalLM

from backends.common.errors import ConfigError
from backends.torch.config import RolloutConfig, config_from_dict
from backends.torch.rollout_vllm import VLLMRolloutEngine
from backends.torch.trainer import GRPORecipe
from tests.helpers.one_rank import join_one_rank_group, one_rank_group
from tests.helpers.torch_tiny import tiny_config

pytestmark = pytest.mark.usefixtures("single_torch_thread")

MULTIPROCESSING = "VLLM_ENABLE_V1_MULTIPROCESSING"


class RecordingLLM:
    """Records its keyword arguments and the vLLM switch in the environment when built."""

    built: ClassVar[list[tuple[dict[str, Any], str | None]]] = []

    def __init__(self, **kwargs: Any) -> None:
        RecordingLLM.built.append((kwargs, os.environ.get(MULTIPROCESSING)))


@pytest.fixture
def recording_vllm(monkeypatch: pytest.MonkeyPatch) -> type[RecordingLLM]:
    stub = types.ModuleType("vllm")
    stub.LLM = RecordingLLM  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", stub)
    monkeypatch.setenv(MULTIPROCESSING, "1")  # vLLM's default; restored after the test
    RecordingLLM.built = []
    return RecordingLLM


def build(cfg: RolloutConfig) -> VLLMRolloutEngine:
    return VLLMRolloutEngine("folder", cfg, dtype="bfloat16", pad_id=0, eos_ids=[1], seed=0)


def test_under_torchrun_each_rank_builds_its_engine_in_process_with_the_external_launcher(
    recording_vllm: type[RecordingLLM],
) -> None:
    with one_rank_group():
        build(RolloutConfig())
    ((kwargs, multiprocessing),) = recording_vllm.built
    assert kwargs["distributed_executor_backend"] == "external_launcher"
    assert kwargs["model"] == "folder"
    assert multiprocessing == "0"


def test_a_single_process_engine_keeps_vllms_own_executor_in_process(
    recording_vllm: type[RecordingLLM],
) -> None:
    build(RolloutConfig())
    ((kwargs, multiprocessing),) = recording_vllm.built
    assert "distributed_executor_backend" not in kwargs
    assert multiprocessing == "0"


def test_tensor_parallel_engines_are_refused_under_torchrun(
    recording_vllm: type[RecordingLLM],
) -> None:
    cfg = RolloutConfig.model_validate({"vllm": {"tensor_parallel_size": 2}})
    with one_rank_group(), pytest.raises(ConfigError, match=r"tensor_parallel_size: expected 1"):
        build(cfg)


def test_a_preset_policy_reaches_the_vllm_engine_as_a_model_folder_under_fsdp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The folder is written from the full state dict (FSDP2 parameters are DTensor shards
    by then; ``save_pretrained`` on them fails on rank 0 while the others wait)."""
    folders: list[str] = []

    def engine(self: VLLMRolloutEngine, model_path: str, *args: Any, **kwargs: Any) -> None:
        folders.append(model_path)

    monkeypatch.setattr(VLLMRolloutEngine, "__init__", engine)
    join_one_rank_group(monkeypatch)
    cfg = tiny_config(
        tmp_path / "run", distributed={"strategy": "fsdp"}, rollout={"engine": "vllm"}
    )
    recipe = GRPORecipe(config_from_dict(cfg))
    try:
        (folder,) = folders
        written = AutoModelForCausalLM.from_pretrained(folder).state_dict()
        full = {k: v.full_tensor() for k, v in recipe.policy.model.state_dict().items()}
    finally:
        recipe.close()
    assert written.keys() == full.keys()
    for name, tensor in full.items():
        torch.testing.assert_close(written[name], tensor, msg=name)
