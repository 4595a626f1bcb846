"""Each response's answer span, from the task's declaration (``data.answer_span``).

``AnswerSpan.mask(response_ids, response_mask)`` gives the (B, R) bool ``answer_mask`` that
``credit_core.assign_credit`` passes to a strategy reading the span (``reads_answer_span``):
True at the response's final-answer tokens, a subset of the valid tokens, EOS never part of
it. A response without an answer (its marker missing) has an all-False row; the strategy
treats it as having no signal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from backends.common.errors import ConfigError
from backends.torch.config import AnswerSpanConfig


@dataclass(frozen=True)
class AnswerSpan:
    """The rule of ``AnswerSpanConfig`` with the marker resolved to its token id:
    ``marker`` (the answer follows its first occurrence) or ``last`` (the answer is the last
    ``last`` tokens before EOS); ``eos_ids`` the policy's EOS tokens."""

    eos_ids: tuple[int, ...]
    marker: int | None = None
    last: int | None = None

    def mask(self, response_ids: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
        """(B, R) bool answer tokens of ``response_ids`` (B, R) int64 at the True positions
        of ``response_mask`` (B, R) bool."""
        eos = torch.isin(response_ids, torch.tensor(self.eos_ids, device=response_ids.device))
        content = response_mask & ~eos
        if self.marker is not None:
            hit = content & (response_ids == self.marker)
            seen = torch.cumsum(hit.long(), dim=1)
            first = hit & (seen == 1)
            return content & (seen >= 1) & ~first
        assert self.last is not None  # AnswerSpanConfig sets exactly one rule
        from_end = torch.flip(torch.cumsum(torch.flip(content.long(), [1]), dim=1), [1])
        return content & (from_end <= self.last)


def build_answer_span(
    cfg: AnswerSpanConfig, tokenizer: PreTrainedTokenizerBase, eos_ids: Sequence[int]
) -> AnswerSpan:
    """``cfg`` for this policy's tokenizer; ``ConfigError`` naming ``data.answer_span.after``
    when the marker is not exactly one token."""
    if cfg.after is None:
        return AnswerSpan(tuple(eos_ids), last=cfg.last)
    ids = tokenizer.encode(cfg.after, add_special_tokens=False)
    if len(ids) != 1:
        raise ConfigError(
            f"data.answer_span.after: {cfg.after!r} is {len(ids)} tokens of the policy's "
            f"tokenizer ({ids}); expected exactly one"
        )
    return AnswerSpan(tuple(eos_ids), marker=int(ids[0]))
