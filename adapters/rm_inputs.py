"""Reward-model input sequences: special-token templates, truncation, padding, positions.

A reward model reads ``prefix + prompt + middle + response + suffix`` (a pair input, as the
RM tokenizer itself would build it: ``[CLS] p [SEP] r [SEP]`` for BERT) or
``prefix + response + suffix`` (a single input). ``SpecialTemplate.probe`` reads these
special tokens and their token-type ids off the RM tokenizer's post-processor once.
``assemble`` lays a batch out, truncating to ``max_length`` (the prompt loses its *first*
tokens, then the response its *last*), pads on the requested side and records where each
response token sits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from adapters.policy import position_ids_from_mask
from adapters.vocab_bridge import plain_backend
from credit_core import CreditError

PaddingSide = Literal["left", "right"]


@dataclass(frozen=True)
class SpecialTemplate:
    """Special tokens around the prompt (segment A) and response (segment B)."""

    pair: bool
    prefix: tuple[int, ...] = ()
    middle: tuple[int, ...] = ()
    suffix: tuple[int, ...] = ()
    prefix_types: tuple[int, ...] = ()
    middle_types: tuple[int, ...] = ()
    suffix_types: tuple[int, ...] = ()
    type_a: int = 0
    type_b: int = 0

    @property
    def n_special(self) -> int:
        return len(self.prefix) + len(self.middle) + len(self.suffix)

    @classmethod
    def probe(cls, tokenizer: Any, *, pair: bool) -> SpecialTemplate:
        """The template the (fast) ``tokenizer`` applies with ``add_special_tokens=True``."""
        enc = plain_backend(tokenizer).encode("a", "b" if pair else None, add_special_tokens=True)
        seq = list(enc.sequence_ids)
        ids, types = list(enc.ids), list(enc.type_ids)
        a = [i for i, s in enumerate(seq) if s == 0]
        b = [i for i, s in enumerate(seq) if s == 1] if pair else []
        if not a or (pair and not b):
            raise CreditError("reward tokenizer: cannot read its special-token template")
        last = b[-1] if pair else a[-1]
        mid = slice(a[-1] + 1, b[0]) if pair else slice(0, 0)
        return cls(
            pair=pair,
            prefix=tuple(ids[: a[0]]),
            middle=tuple(ids[mid]),
            suffix=tuple(ids[last + 1 :]),
            prefix_types=tuple(types[: a[0]]),
            middle_types=tuple(types[mid]),
            suffix_types=tuple(types[last + 1 :]),
            type_a=types[a[0]],
            type_b=types[b[0]] if pair else types[a[0]],
        )


@dataclass(frozen=True)
class RMInputs:
    """One padded batch of reward-model inputs.

    - input_ids, attention_mask, token_type_ids, position_ids: (B, L) int64; positions count
      attended tokens from 0 (padding gets 1), so left padding shifts nothing.
    - response_positions (B, K) int64: where response token k sits (0 where invalid);
      response_valid (B, K) bool: the response tokens actually present (not truncated).
    - n_truncated: response tokens cut by ``max_length`` (they get no gradient).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor
    position_ids: torch.Tensor
    response_positions: torch.Tensor
    response_valid: torch.Tensor
    n_truncated: int


def assemble(
    prompts: Sequence[Sequence[int]] | None,
    responses: Sequence[Sequence[int]],
    template: SpecialTemplate,
    *,
    pad_id: int,
    padding_side: PaddingSide,
    max_length: int,
    device: torch.device,
) -> RMInputs:
    """Lay out ``prefix + prompt + middle + response + suffix`` rows (prompt omitted when
    ``prompts`` is None; then ``template`` must be a single-input template)."""
    if (prompts is not None) != template.pair:
        raise CreditError("assemble: a pair template needs prompts, a single one none")
    budget = max_length - template.n_special
    if budget < 1:
        raise CreditError(
            f"max_length: {max_length} leaves no room next to {template.n_special} special tokens"
        )
    rows: list[list[int]] = []
    types: list[list[int]] = []
    starts: list[int] = []
    kept: list[int] = []
    n_truncated = 0
    for b, resp in enumerate(responses):
        prompt = list(prompts[b]) if prompts is not None else []
        r_keep = min(len(resp), budget)
        p_keep = min(len(prompt), budget - r_keep)
        n_truncated += len(resp) - r_keep
        p = prompt[len(prompt) - p_keep :]
        head = [*template.prefix, *p, *template.middle]
        rows.append([*head, *resp[:r_keep], *template.suffix])
        types.append(
            [
                *template.prefix_types,
                *([template.type_a] * len(p)),
                *template.middle_types,
                *([template.type_b] * r_keep),
                *template.suffix_types,
            ]
        )
        starts.append(len(head))
        kept.append(r_keep)
    B = len(rows)
    L = max(len(r) for r in rows)
    K = max(max(kept), 1)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    tt = torch.zeros((B, L), dtype=torch.long)
    mask = torch.zeros((B, L), dtype=torch.long)
    offsets = []
    for b, (row, ty) in enumerate(zip(rows, types, strict=True)):
        off = L - len(row) if padding_side == "left" else 0
        ids[b, off : off + len(row)] = torch.tensor(row, dtype=torch.long)
        tt[b, off : off + len(row)] = torch.tensor(ty, dtype=torch.long)
        mask[b, off : off + len(row)] = 1
        offsets.append(off + starts[b])
    k = torch.arange(K)
    valid = k.unsqueeze(0) < torch.tensor(kept).unsqueeze(1)
    positions = torch.where(valid, torch.tensor(offsets).unsqueeze(1) + k, 0)
    pos_ids = position_ids_from_mask(mask)
    return RMInputs(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        token_type_ids=tt.to(device),
        position_ids=pos_ids.to(device),
        response_positions=positions.to(device),
        response_valid=valid.to(device),
        n_truncated=n_truncated,
    )
