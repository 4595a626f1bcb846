"""Taking the policy statistics from OpenRLHF's own log-prob forward (no second forward).

OpenRLHF's ``make_experience`` dispatches ``forward`` to the policy actors, which call their
``Actor`` under ``no_grad`` for the action log-probs; its float32, temperature-scaled logits
exist only inside that call. Two pieces let the credit code see them:

- ``keeping_logits(actor, on_logits)``: within the block, ``actor`` (an OpenRLHF ``Actor``)
  runs its own ``forward`` with ``return_output=True``, hands the logits to ``on_logits``
  and returns exactly what its caller asked for. Nothing else about the call changes.
- ``CaptureStore``: what was reduced from each micro-batch's forward, kept (on the CPU)
  until ``compute_advantages_and_returns`` asks for it with the same micro-batch tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import torch

#: ``on_logits(logits, sequences, action_mask, attention_mask)``: logits float32 of the
#: forward, already divided by the temperature, (B, T, V), or (1, N, V) when the ``Actor``
#: packs the micro-batch (``backends.openrlhf.packing``); the other tensors as passed to it
#: (padded (B, T) either way).
LogitsHook = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]

T = TypeVar("T")


@contextmanager
def keeping_logits(actor: torch.nn.Module, on_logits: LogitsHook) -> Iterator[None]:
    """Within the block, every call of ``actor`` with an ``action_mask`` passes its logits to
    ``on_logits`` before returning what the caller asked for (log-probs, or log-probs and
    output). The instance attribute ``forward`` is set for the block and restored after it.
    """
    own = actor.forward
    shadowed = "forward" in vars(actor)  # an instance-level forward already in place

    def forward(
        sequences: torch.Tensor,
        action_mask: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        return_output: bool = False,
        **kwargs: Any,
    ) -> Any:
        if action_mask is None or attention_mask is None:
            return own(sequences, action_mask, attention_mask, return_output, **kwargs)
        log_probs, output = own(
            sequences, action_mask, attention_mask, return_output=True, **kwargs
        )
        on_logits(output["logits"], sequences, action_mask, attention_mask)
        return (log_probs, output) if return_output else log_probs

    actor.forward = forward
    try:
        yield
    finally:
        if shadowed:
            actor.forward = own
        else:
            del actor.forward


@dataclass
class _Entry(Generic[T]):
    sequences: torch.Tensor
    action_mask: torch.Tensor
    value: T


@dataclass
class CaptureStore(Generic[T]):
    """Values reduced from forwards, looked up by the micro-batch they came from.

    ``put`` keeps a value with CPU copies of the micro-batch's ``sequences`` and
    ``action_mask``; ``take`` returns (and removes) the value of an equal micro-batch, or
    None. Both calls see the micro-batches of one actor in the same order (OpenRLHF's
    ``execute_batch`` runs a rank's list in order), so entries put before the one taken
    belong to a round whose credit was never asked for and are dropped.
    """

    entries: list[_Entry[T]] = field(default_factory=list)

    def put(self, sequences: torch.Tensor, action_mask: torch.Tensor, value: T) -> None:
        self.entries.append(_Entry(sequences.cpu(), action_mask.cpu(), value))

    def take(self, sequences: torch.Tensor, action_mask: torch.Tensor) -> T | None:
        seqs, acts = sequences.cpu(), action_mask.cpu()
        for i, entry in enumerate(self.entries):
            if (
                entry.sequences.shape == seqs.shape
                and entry.action_mask.shape == acts.shape
                and torch.equal(entry.sequences, seqs)
                and torch.equal(entry.action_mask, acts)
            ):
                del self.entries[: i + 1]
                return entry.value
        return None

    def __len__(self) -> int:
        return len(self.entries)
