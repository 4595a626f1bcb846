"""``DistContext``: collectives on the backend's device, whatever device a tensor is on."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from backends.torch.config import config_from_dict
from backends.torch.distributed import DistContext
from backends.torch.trainer import GRPORecipe
from tests.helpers.one_rank import join_one_rank_group
from tests.helpers.torch_tiny import tiny_config

pytestmark = pytest.mark.usefixtures("single_torch_thread")


@pytest.mark.parametrize("collective", ["all_reduce_sum", "all_reduce_max", "all_gather_cat"])
def test_a_collective_on_a_tensor_off_the_backend_device_is_refused(collective: str) -> None:
    """NCCL registers for device type ``cuda`` only; ``strict_device`` refuses what NCCL
    would, on any machine (here a rank whose NCCL device is ``meta``)."""
    ctx = DistContext(0, 2, 0, torch.device("meta"), "nccl", strict_device=True)
    assert ctx.collective_device == torch.device("meta")
    with pytest.raises(ValueError, match=rf"{collective}: the tensor is on cpu, but the nccl"):
        getattr(ctx, collective)(torch.ones(2))


def test_gloo_and_one_process_reduce_on_the_cpu() -> None:
    for backend in ("gloo", None):
        ctx = DistContext(0, 1, 0, torch.device("cuda", 3), backend)
        assert ctx.collective_device == torch.device("cpu")


def test_every_collective_of_a_training_step_gets_a_tensor_placed_on_the_backend_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fake NCCL in front of a one-rank gloo group takes only tensors that
    ``DistContext.to_backend`` placed on the collective device, and raises NCCL's own
    error for the rest (a ``torch.tensor(...)`` made on the CPU and handed to NCCL)."""
    placed: list[torch.Tensor] = []
    to_backend = getattr(DistContext, "to_backend", None)

    def placing(self: DistContext, tensor: torch.Tensor, what: str) -> torch.Tensor:
        assert to_backend is not None
        out: torch.Tensor = to_backend(self, tensor, what)
        placed.append(out)
        return out

    def only_placed(name: str) -> Any:
        real = getattr(dist, name)

        def collective(*args: Any, **kwargs: Any) -> Any:
            tensor = args[1] if name == "all_gather" else args[0]
            if not any(tensor is t for t in placed):
                raise RuntimeError("No backend type associated with device type cpu")
            return real(*args, **kwargs)

        return collective

    monkeypatch.setattr(DistContext, "to_backend", placing, raising=False)
    for name in ("all_reduce", "all_gather"):
        monkeypatch.setattr(dist, name, only_placed(name))
    join_one_rank_group(monkeypatch, strict_device=True)
    cfg = tiny_config(tmp_path / "run", steps=1, credit="datc", eval={"interval": 1})
    recipe = GRPORecipe(config_from_dict(cfg))
    try:
        metrics = recipe.train_step()
        metrics.update(recipe.evaluate())
    finally:
        recipe.close()
    assert placed and {t.device for t in placed} == {recipe.ctx.collective_device}
    assert "eval/reward_sampled" in metrics and "credit/weight_max" in metrics


def test_a_launched_single_process_with_a_named_backend_forms_a_one_process_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """How the GPU smoke test runs NCCL and FSDP on one GPU (``torchrun --nproc_per_node 1``
    with ``distributed.backend: nccl``); here with gloo."""
    from backends.torch.config import DistributedConfig
    from backends.torch.distributed import init_distributed, shutdown

    for name, value in {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    with socket.socket() as free:  # a port nothing else listens on
        free.bind(("127.0.0.1", 0))
        monkeypatch.setenv("MASTER_PORT", str(free.getsockname()[1]))
    assert not init_distributed(DistributedConfig(), "cpu").active  # auto: no group
    ctx = init_distributed(DistributedConfig(backend="gloo"), "cpu")
    try:
        assert ctx.active and ctx.backend == "gloo" and dist.get_world_size() == 1
    finally:
        shutdown(ctx)
