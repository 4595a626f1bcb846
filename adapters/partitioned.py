"""Reading weights that a distributed wrapper may hold partitioned, outside its forward.

DeepSpeed ZeRO-3 keeps each parameter as an empty partition (shape ``[0]``, its
``ds_status`` not AVAILABLE) except inside its module's forward; FSDP2 keeps the root
module's own parameters (embeddings, final norm, LM head) as ``DTensor`` shards except
inside the root's forward. Code that reads a weight directly (an embedding table, an LM
head) or runs a submodule on its own (``get_decoder()``) must make them whole first:
``gathered`` for ZeRO-3 parameters, ``policy_weights_whole`` for a policy under either.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from adapters.policy import unwrap_model


@contextmanager
def gathered(*params: torch.Tensor | None) -> Iterator[None]:
    """Make ZeRO-3 partitioned ``params`` whole for the duration (read-only), else nothing.

    ``deepspeed.zero.GatheredParameters`` all-gathers them on every rank (collective: every
    rank must enter). Parameters that are already whole (no ZeRO-3, or kept available by a
    running forward) are left alone; duplicates (tied weights) are gathered once. Copy what
    must outlive the block: the partitions are freed again on exit.
    """
    partitioned = {id(p): p for p in params if p is not None and is_partitioned(p)}
    if not partitioned:
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(partitioned.values()), modifier_rank=None):
        yield


def is_partitioned(param: torch.Tensor) -> bool:
    """Whether ``param`` is a ZeRO-3 partition that is not gathered now."""
    return getattr(param, "ds_status", None) is not None and not _available(param)


def _available(param: torch.Tensor) -> bool:
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    return bool(param.ds_status == ZeroParamStatus.AVAILABLE)  # type: ignore[attr-defined]


@contextmanager
def policy_weights_whole(model: torch.nn.Module) -> Iterator[None]:
    """Within it, a causal LM ``model`` can be read outside its forward: its LM head read
    (``adapters.policy.lm_head_of``) and its decoder run alone (``final_hidden_states``).

    FSDP2 (``model`` has ``unshard``/``reshard``): the root's own parameters are gathered and
    sharded again on exit (the decoder layers' own FSDP hooks still run in their forwards);
    collective. ZeRO-3: the LM head's partitions are gathered (the decoder's modules gather
    theirs in their forwards). A no-op for a plain or DDP-wrapped model.
    """
    head = unwrap_model(model).get_output_embeddings()  # type: ignore[operator]
    unshard, reshard = getattr(model, "unshard", None), getattr(model, "reshard", None)
    fsdp = callable(unshard) and callable(reshard)
    with gathered(getattr(head, "weight", None), getattr(head, "bias", None)):
        if fsdp:
            unshard()  # type: ignore[misc]
        try:
            yield
        finally:
            if fsdp:
                reshard()  # type: ignore[misc]
