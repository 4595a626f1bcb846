"""Process group, model wrapping (DDP / FSDP2) and the few collectives the recipe uses.

Launched by ``torchrun`` (``WORLD_SIZE`` > 1 in the environment) the trainer joins a process
group: ``nccl`` on GPUs, ``gloo`` on CPU (``backend: auto``). A single process needs no group;
every helper here then degrades to the identity.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from backends.torch.config import DistributedConfig

T = TypeVar("T")


@dataclass(frozen=True)
class DistContext:
    """Where this process sits: rank, world size and its device.

    The tensor collectives (``all_reduce_sum``, ``all_reduce_max``, ``all_gather_cat``)
    run on ``collective_device``, the device the backend takes tensors on (NCCL has no CPU
    collectives, gloo's are the CPU ones): a tensor elsewhere is copied there for the
    collective and the result comes back on the tensor's own device. With ``strict_device``
    a collective refuses such a tensor instead (``ValueError``), the way NCCL itself does:
    the tests run the trainer with it to find tensors made on the wrong device.
    """

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str | None  # None: single process, no process group
    strict_device: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.backend is not None

    @property
    def collective_device(self) -> torch.device:
        """The device the backend's collectives take tensors on: this rank's GPU under
        NCCL, the CPU otherwise (gloo, or one process). Make reduced tensors there."""
        return self.device if self.backend == "nccl" else torch.device("cpu")

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def to_backend(self, tensor: torch.Tensor, what: str) -> torch.Tensor:
        """A detached, contiguous copy of ``tensor`` on ``collective_device`` (the buffer a
        collective works in); ``what`` names the collective in the ``strict_device`` error."""
        dev = self.collective_device
        if self.strict_device and tensor.device != dev:
            raise ValueError(
                f"{what}: the tensor is on {tensor.device}, but the {self.backend or 'local'} "
                f"backend's collectives take tensors on {dev} (make it with "
                "device=ctx.collective_device)"
            )
        return tensor.detach().to(dev, copy=True).contiguous()

    def _reduce(self, tensor: torch.Tensor, op: Any, what: str) -> torch.Tensor:
        out = self.to_backend(tensor, what)
        if self.active:
            dist.all_reduce(out, op=op)
        return out.to(tensor.device)

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The sum over ranks (a new tensor on ``tensor``'s device; ``tensor`` is left
        unchanged)."""
        return self._reduce(tensor, dist.ReduceOp.SUM, "all_reduce_sum")

    def all_reduce_max(self, tensor: torch.Tensor) -> torch.Tensor:
        """The element-wise maximum over ranks (a new tensor on ``tensor``'s device)."""
        return self._reduce(tensor, dist.ReduceOp.MAX, "all_reduce_max")

    def all_gather_object(self, obj: T) -> list[T]:
        """Every rank's ``obj`` (picklable), in rank order; ``[obj]`` in one process.

        Only for objects this run's own processes made: they travel pickled."""
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj: T) -> T:
        """Rank 0's ``obj`` on every rank (picklable; other ranks' ``obj`` is ignored)."""
        if not self.active:
            return obj
        box: list[Any] = [obj]
        dist.broadcast_object_list(box, src=0)
        return cast(T, box[0])

    def all_gather_cat(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenation over ranks along dim 0, in rank order, on ``tensor``'s device;
        equal shapes on every rank."""
        mine = self.to_backend(tensor, "all_gather_cat")
        if self.active:
            parts = [torch.empty_like(mine) for _ in range(self.world_size)]
            dist.all_gather(parts, mine)
            mine = torch.cat(parts)
        return mine.to(tensor.device)

    def gather_values(self, values: torch.Tensor) -> torch.Tensor:
        """A 1-D tensor concatenated over ranks in rank order, on ``values``' device and in
        its dtype; the lengths may differ between ranks (each is padded to the longest for
        the collective and cut back), and so may the floating dtypes: the values travel as
        float64 (exact for every floating dtype up to float64), so a rank without a valid
        token takes part with an empty tensor of any dtype. ``credit_core.CreditBatch.gather``."""
        if not self.active:
            return values
        lengths = self.all_gather_cat(torch.tensor([values.numel()], device=values.device))
        longest = int(lengths.max())
        padded = torch.zeros(longest, dtype=torch.float64, device=values.device)
        padded[: values.numel()] = values
        parts = self.all_gather_cat(padded).view(self.world_size, longest)
        joined = torch.cat([parts[r, : int(n)] for r, n in enumerate(lengths.tolist())])
        return joined.to(values.dtype)


def init_distributed(cfg: DistributedConfig, device: str = "auto") -> DistContext:
    """Join the torchrun process group if there is one, and pick this process's device.

    One process joins no group, unless a launcher started it (``MASTER_ADDR`` is set) and
    ``distributed.backend`` is named: then it forms a one-process group of that backend, so
    NCCL collectives and the DDP/FSDP wraps run on a single GPU (``scripts/gpu_smoke.sh``).
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() if device == "auto" else device == "cuda"
    if use_cuda and not torch.cuda.is_available():
        raise RuntimeError("device: 'cuda' was requested but CUDA is not available")
    dev = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(dev)
    one_process_group = "MASTER_ADDR" in os.environ and cfg.backend != "auto"
    if world_size == 1 and not one_process_group:
        return DistContext(0, 1, 0, dev, None)
    backend = cfg.backend if cfg.backend != "auto" else ("nccl" if use_cuda else "gloo")
    if backend == "nccl" and not use_cuda:
        raise RuntimeError("distributed.backend: 'nccl' needs CUDA devices; use 'gloo' on CPU")
    if not dist.is_initialized():
        dist.init_process_group(backend=backend)
    return DistContext(rank, world_size, local_rank, dev, backend)


def shutdown(ctx: DistContext, *, barrier: bool = True) -> None:
    """Destroy the process group; with ``barrier`` (every rank calls this), first a barrier
    whose work object is kept until the group is gone: gloo's barrier holds the collectives
    still in flight, so no gloo worker thread frees their (Python-owned) tensors, which needs
    the GIL, while the group's destructor waits for those threads with the GIL held. Free
    everything else that holds the group (DDP/FSDP-wrapped models, optimizers) first."""
    if ctx.active and dist.is_initialized():
        last = dist.barrier(async_op=True) if barrier else None
        if last is not None:
            last.wait()
        dist.destroy_process_group()
        del last


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a Hugging Face causal LM (the units FSDP shards)."""
    inner = unwrap(model)
    inner = getattr(inner, "module", inner)  # the HF model inside a PolicyModule
    no_split = set(getattr(inner, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in no_split]
    if not layers:
        raise ValueError(
            f"{type(inner).__name__}: cannot find its decoder layers for FSDP "
            "(model._no_split_modules is empty); use distributed.strategy: ddp"
        )
    return layers


def wrap_model(model: torch.nn.Module, ctx: DistContext, strategy: str) -> torch.nn.Module:
    """DDP- or FSDP2-wrap ``model`` for training across ranks; unchanged in one process.

    FSDP shards every decoder layer, then the root (``fully_shard``), in place; the root's
    own parameters are kept gathered between forward and backward. ``model`` must accept
    ``input_ids`` and ``attention_mask`` (a ``PolicyModule``).
    """
    if not ctx.active:
        return model
    if strategy == "ddp":
        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids)
    if strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in _decoder_layers(model):
            fully_shard(layer)
        # The root group (embeddings, final norm, LM head) stays gathered after forward:
        # the streamed log-probs read the LM head weight outside the module's forward.
        fully_shard(model, reshard_after_forward=False)
        # FSDP initializes lazily at the first forward, which must go through the root;
        # generate() calls the inner model directly, so run one tiny root forward now.
        token = torch.zeros(1, 1, dtype=torch.long, device=ctx.device)
        with torch.no_grad():
            model(input_ids=token, attention_mask=torch.ones_like(token))
        model.reshard()  # type: ignore[operator]  # parameters() = the shards, for the optimizer
        return model
    raise ValueError(f"distributed.strategy: expected 'ddp' or 'fsdp', got {strategy!r}")


def unwrap(model: torch.nn.Module) -> Any:
    """The ``PolicyModule`` inside a DDP wrapper (FSDP2 wraps in place)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


@contextlib.contextmanager
def grad_sync(model: torch.nn.Module, enabled: bool) -> Iterator[None]:
    """Within it, backward all-reduces gradients only if ``enabled`` (micro-batch accumulation)."""
    if isinstance(model, DistributedDataParallel) and not enabled:
        with model.no_sync():
            yield
        return
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(enabled)  # type: ignore[operator]
    yield


def _is_fsdp(model: torch.nn.Module) -> bool:
    return hasattr(model, "set_requires_gradient_sync")


@contextlib.contextmanager
def root_gathered(model: torch.nn.Module, *, reshard: bool) -> Iterator[None]:
    """FSDP2: gather the root's own parameters (embeddings, final norm, LM head) for code
    that reads them outside the root's forward: ``generate`` (which calls the inner model)
    and the streamed log-probs (which fetch the LM head weight before the forward).
    ``reshard`` shards them again on exit; otherwise FSDP does after the next backward.
    A no-op for DDP and single-process models."""
    fsdp = _is_fsdp(model)
    if fsdp:
        model.unshard()  # type: ignore[operator]
    try:
        yield
    finally:
        if fsdp and reshard:
            model.reshard()  # type: ignore[operator]


def sharded_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, Any], dict[str, Any]]:
    """This rank's model and optimizer state dicts as DCP saves and loads them; collective.

    Keys are parameter names (DDP's wrapper prefix removed); under FSDP the tensors are this
    rank's DTensor shards, so nothing is gathered. The tensors are the live ones: loading
    into them in place (``dcp.load``) fills the model. An optimizer that has not stepped yet
    gets its state initialized first (zero-gradient step at lr 0), so the dicts always list
    every tensor a checkpoint holds.
    """
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    if _is_fsdp(model):
        model.reshard()  # type: ignore[operator]  # registered params = the optimizer's shards
    return dict(get_model_state_dict(model)), dict(get_optimizer_state_dict(model, optimizer))


def load_sharded_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    model_state: dict[str, Any],
    optimizer_state: dict[str, Any],
) -> None:
    """Inverse of ``sharded_state``: set the model and optimizer from loaded state dicts."""
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    if _is_fsdp(model):
        model.reshard()  # type: ignore[operator]
    set_model_state_dict(model, model_state)
    set_optimizer_state_dict(model, optimizer, optimizer_state)


def full_model_state(model: torch.nn.Module, ctx: DistContext) -> dict[str, torch.Tensor] | None:
    """The full (unsharded) model state dict on rank 0, None elsewhere; collective under FSDP.

    Keys are the ``PolicyModule``'s (DDP's wrapper prefix removed)."""
    if _is_fsdp(model):
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        model.reshard()  # type: ignore[operator]
        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(model, options=opts)
        return cast(dict[str, torch.Tensor], state) if ctx.is_main else None
    return dict(unwrap(model).state_dict()) if ctx.is_main else None
