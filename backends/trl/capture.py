"""Reading the policy inside TRL's forward: final hidden states and the (gathered) LM head.

TRL 1.16 calls the policy with a fused LM head (``trl.trainer.utils.add_fused_lm_head``): the
forward runs the backbone (``model.base_model``), then streams the LM head over the
vocabulary without materialising logits and returns no hidden states. ``HiddenCapture``
records the backbone's ``last_hidden_state`` through a forward hook, only while asked to, so
generation and other forwards are not recorded. ``lm_head`` finds the LM head of a plain,
DDP/DeepSpeed-wrapped or PEFT model and makes a ZeRO-3 partitioned head whole (``gathered``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from adapters.partitioned import gathered
from adapters.policy import lm_head_of
from credit_core import CreditError


def causal_lm_of(model: torch.nn.Module) -> torch.nn.Module:
    """The ``transformers`` causal LM inside ``model``: through ``.module`` wrappers (DDP,
    DeepSpeed) and PEFT (``get_base_model()``, the model whose forward TRL patched)."""
    inner: Any = model
    while hasattr(inner, "module") and not hasattr(inner, "base_model_prefix"):
        inner = inner.module
    get_base = getattr(inner, "get_base_model", None)
    if callable(get_base):  # peft.PeftModel
        inner = get_base()
    if not hasattr(inner, "get_output_embeddings") or not hasattr(inner, "base_model_prefix"):
        raise CreditError(
            f"model: expected a transformers causal LM (or one wrapped by PEFT/DDP/DeepSpeed), "
            f"got {type(model).__name__}"
        )
    found: torch.nn.Module = inner
    return found


@contextmanager
def lm_head(model: torch.nn.Module) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
    """Yield the LM head's weight (V, H) and bias (V,) or None of ``causal_lm_of(model)``,
    whole for the duration of the block (ZeRO-3 partitions are gathered, see ``gathered``).

    Raises ``CreditError`` when the head is not ``hidden @ W.T + b`` (logit soft-capping or
    scaling, see ``adapters.policy.lm_head_of``) or carries a PEFT adapter (its weight would
    not be the head that produced the log-probs). FSDP2 ``DTensor`` shards are made whole.
    """
    lm = causal_lm_of(model)
    head = lm.get_output_embeddings()  # type: ignore[operator]
    if hasattr(head, "base_layer"):
        raise CreditError(
            "model: the LM head carries a PEFT adapter (target_modules includes lm_head); "
            "policy statistics need the plain head: remove lm_head from the adapter's modules"
        )
    with gathered(getattr(head, "weight", None), getattr(head, "bias", None)):
        weight, bias = lm_head_of(lm)
        yield _full(weight), None if bias is None else _full(bias)


def _full(param: torch.Tensor) -> torch.Tensor:
    """The whole tensor of an FSDP2-sharded ``DTensor`` parameter (as TRL's fused head
    does), else ``param`` itself."""
    full = getattr(param, "full_tensor", None)
    return full() if callable(full) else param


class HiddenCapture:
    """Records the backbone's final hidden states (B, L, H) of the forwards run while
    ``recording()`` is active; one tensor per backbone call (TRL chunks its batch)."""

    def __init__(self, model: torch.nn.Module) -> None:
        lm = causal_lm_of(model)
        backbone = getattr(lm, "base_model", None)
        if not isinstance(backbone, torch.nn.Module) or backbone is lm:
            raise CreditError(
                f"model: {type(lm).__name__} has no separate backbone (base_model) whose "
                "last_hidden_state feeds the LM head"
            )
        self._chunks: list[torch.Tensor] | None = None
        self._handle = backbone.register_forward_hook(self._hook)

    def _hook(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self._chunks is None:
            return
        hidden = getattr(output, "last_hidden_state", None)
        if hidden is None and isinstance(output, tuple):
            hidden = output[0]
        if not isinstance(hidden, torch.Tensor):
            raise CreditError(
                f"model backbone: expected an output with last_hidden_state, got "
                f"{type(output).__name__}"
            )
        self._chunks.append(hidden)

    @contextmanager
    def recording(self) -> Iterator[list[torch.Tensor]]:
        """Yield the list that the backbone forwards inside the block append to."""
        if self._chunks is not None:
            raise CreditError("HiddenCapture.recording: already recording (nested forwards)")
        chunks: list[torch.Tensor] = []
        self._chunks = chunks
        try:
            yield chunks
        finally:
            self._chunks = None

    def remove(self) -> None:
        """Remove the hook."""
        self._handle.remove()
