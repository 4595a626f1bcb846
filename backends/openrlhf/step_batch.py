"""The step's micro-batches as one batch: action columns left-aligned, zero-padded to the
widest micro-batch, with each response's reward and group (what a strategy that sees the whole
step gets, and the step's credit under a critic: ``backends.openrlhf.credit``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from backends.openrlhf.layout import action_token_ids
from credit_core import CreditError, CreditSignals
from credit_core.batch import TOKEN_SIGNALS


def padded(values: torch.Tensor, width: int) -> torch.Tensor:
    """(n, A) ``values`` with zero columns appended up to ``width`` >= A."""
    return torch.nn.functional.pad(values, (0, width - values.shape[1]))


@dataclass(frozen=True)
class StepBatch:
    """The step's micro-batches (``Experience`` k: B_k responses, A_k action columns) stacked
    in order into N = sum B_k rows of W = max A_k columns.

    - ``mask`` (N, W) bool: the action masks, False in the padding columns.
    - ``token_ids`` (N, W) int64: the action tokens, 0 in the padding columns.
    - ``sizes``, ``widths``: each micro-batch's B_k and A_k.
    """

    mask: torch.Tensor
    token_ids: torch.Tensor
    sizes: list[int]
    widths: list[int]

    @property
    def width(self) -> int:
        return int(self.mask.shape[1])

    def split(self, values: torch.Tensor) -> list[torch.Tensor]:
        """(N, W) step values -> each micro-batch's (B_k, A_k) part (views)."""
        parts = torch.split(values, self.sizes)
        return [part[:, :w] for part, w in zip(parts, self.widths, strict=True)]


def step_batch(experiences: Sequence[Any]) -> StepBatch:
    """The ``StepBatch`` of ``experiences`` (each with ``action_mask`` (B_k, A_k) and
    ``sequences``)."""
    widths = [int(e.action_mask.shape[1]) for e in experiences]
    width = max(widths)
    mask = torch.cat([padded(e.action_mask.bool(), width) for e in experiences])
    ids = torch.cat(
        [padded(action_token_ids(e.sequences, e.action_mask), width) for e in experiences]
    )
    sizes = [int(e.action_mask.shape[0]) for e in experiences]
    return StepBatch(mask, ids, sizes, widths)


def stacked_signals(credits: Sequence[CreditSignals], width: int) -> CreditSignals:
    """The per-token signals of the micro-batches' ``credits`` (n_k, A_k), stacked along the
    batch and zero-padded to ``width`` columns. A signal present in some micro-batches only
    is a ``CreditError`` naming it."""
    stacked: dict[str, Any] = {}  # TOKEN_SIGNALS names: (n, width) tensors
    for name in TOKEN_SIGNALS:
        values = [getattr(credit, name) for credit in credits]
        present = [value for value in values if value is not None]
        if not present:
            continue
        if len(present) != len(values):
            lacking = [k for k, value in enumerate(values) if value is None]
            raise CreditError(
                f"credit signals: {name!r} is missing from micro-batches {lacking} of the step"
            )
        stacked[name] = torch.cat([padded(value, width) for value in present])
    return CreditSignals(**stacked)  # every per-token signal, none dropped


def outcome_rewards(experiences: Sequence[Any], clip_range: Sequence[float] | None) -> torch.Tensor:
    """(N,) float32: each response's reward ``experience.rewards`` (after OpenRLHF's length
    penalties), clamped to ``clip_range`` when it is given, the micro-batches concatenated in
    order. Under a critic OpenRLHF's ``compute_reward`` clamps that reward to
    ``--reward.clip_range`` (pass it); under a response-level estimator it clamps the
    normalized reward instead (pass None)."""
    rewards = torch.cat([e.rewards.reshape(-1).to(torch.float32) for e in experiences])
    if clip_range:
        rewards = rewards.clamp(min=clip_range[0], max=clip_range[1])
    return rewards


def step_groups(experiences: Sequence[Any], n_samples_per_prompt: int) -> torch.Tensor:
    """(N,) int64: each response's prompt, ``Experience.index`` // ``n_samples_per_prompt``
    (OpenRLHF's ``index`` is the sample's place in the step's rollout, prompt by prompt)."""
    index = torch.cat([torch.as_tensor(e.index, dtype=torch.long).reshape(-1) for e in experiences])
    if sorted(index.tolist()) != list(range(index.numel())):
        raise CreditError(
            "experience.index: expected the step's samples numbered 0..N-1 once each, got "
            f"{index.tolist()}"
        )
    return index // n_samples_per_prompt
