"""Reading weights that a distributed wrapper may hold partitioned, outside its forward.

DeepSpeed ZeRO-3 keeps each parameter as an empty partition (shape ``[0]``, its
``ds_status`` not AVAILABLE) except inside its module's forward; FSDP2 keeps the root
module's own parameters (embeddings, final norm, LM head) as ``DTensor`` shards except
inside the root's forward. Code that reads a weight directly (an embedding table, an LM
head) or runs a submodule on its own (``get_decoder()``) must make them whole first:
``gathered`` for ZeRO-3 parameters.

A model that no DeepSpeed engine wraps (a frozen direction model) must not be partitioned
in the first place: ``outside_zero3_init`` loads it whole while a ZeRO-3 trainer holds
transformers' live DeepSpeed config.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch


@contextmanager
def outside_zero3_init() -> Iterator[None]:
    """Models built in the block load whole, as without DeepSpeed.

    Under ZeRO-3, transformers' ``TrainingArguments`` (TRL's trainer config) keeps a live
    ``HfDeepSpeedConfig``, which transformers finds through a module-level weakref
    (``is_deepspeed_zero3_enabled``); while it is set, ``from_pretrained`` builds every model
    inside ``deepspeed.zero.Init``: shape-``[0]`` partitions, made whole only by the engine
    ``deepspeed.initialize`` would wrap them in. The block runs with that weakref unset
    (``unset_hf_deepspeed_config``) and sets the same config again on exit, so the trainer's
    own models are unaffected. Without transformers, or without a live config, nothing
    changes."""
    try:
        from transformers.integrations import deepspeed as hf_deepspeed
    except ImportError:
        yield
        return
    ref = hf_deepspeed._hf_deepspeed_config_weak_ref
    live = None if ref is None else ref()
    if live is None:
        yield
        return
    hf_deepspeed.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        hf_deepspeed.set_hf_deepspeed_config(live)


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


def holds_zero3_params(modules: Iterable[torch.nn.Module]) -> bool:
    """Whether any parameter of ``modules`` is a ZeRO-3 parameter (``ds_id``), gathered now
    or not: each forward of such a module is then a collective (its all-gathers), which
    every process must enter as often as the others."""
    return any(hasattr(p, "ds_id") for m in modules for p in m.parameters())


def is_partitioned(param: torch.Tensor) -> bool:
    """Whether ``param`` is a ZeRO-3 partition that is not gathered now."""
    return getattr(param, "ds_status", None) is not None and not _available(param)


def _available(param: torch.Tensor) -> bool:
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    return bool(param.ds_status == ZeroParamStatus.AVAILABLE)  # type: ignore[attr-defined]
