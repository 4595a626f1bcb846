"""Where a sequence position's output row is in OpenRLHF's packed forward.

With ``--ds.packing_samples`` OpenRLHF 0.11 still hands its model actors padded (B, T)
micro-batches (``sequences``, ``attention_mask``); the ``Actor`` and the ``RewardModel``
unpad them inside their ``forward`` (``ring_attn_utils.unpad_and_slice_tensor``, flash-attn's
``unpad_input``): the attended tokens of all samples, in row-major order, become ONE row
(1, N) with position ids restarting at 0 for each sample, and the model's outputs (logits
(1, N, V), hidden states and input embeddings (1, N, d)) follow that row. The attended
position (b, t) is row ``rank(b, t)`` of it: the number of attended positions before it in
row-major order (``unpad_input``'s ``indices`` are those positions, sorted).

``OutputRows`` reads per-sample spans of an output in either layout as views (no copy of
the output: a packed sample's attended tokens are contiguous in the row), and
``to_padded`` scatters a packed (1, N, ...) output back to (B, T, ...) where a consumer
needs the padded layout (the reward model's input gradient, d wide, never the logits).
Ring attention (each rank holding a slice of the row) is not covered.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from credit_core import CreditError


@dataclass(frozen=True)
class OutputRows:
    """The layout of one forward's output over a (B, T) micro-batch.

    - ``packed``: False: the output is (B, T, ...) and (b, t) is row [b, t]; True: it is
      (1, N, ...) with N the attended tokens, and (b, t) is row [0, ``rank[b, t]``].
    - ``rank`` (B, T) long: on attended positions their index in the packed row (0 ... N-1,
      row-major), -1 elsewhere; None when not packed.
    """

    packed: bool
    rank: torch.Tensor | None

    def span(self, output: torch.Tensor, b: int, t0: int, t1: int) -> torch.Tensor:
        """Rows (1, t1 - t0, ...) of ``output`` for positions t0 <= t < t1 of sample ``b``,
        a view of ``output``. Packed: ``CreditError`` unless those positions are all
        attended (a span with a padding hole has no contiguous rows)."""
        if not self.packed:
            return output[b, t0:t1].unsqueeze(0)
        assert self.rank is not None
        ranks = self.rank[b, t0:t1]
        first = int(ranks[0])
        if first < 0 or int(ranks[-1]) - first != t1 - t0 - 1 or bool((ranks < 0).any()):
            raise CreditError(
                f"packed output: positions [{t0}, {t1}) of sample {b} are not all attended "
                "(attention_mask), so they have no contiguous rows in the packed forward"
            )
        return output[0, first : first + t1 - t0].unsqueeze(0)


def output_rows(output: torch.Tensor, attention_mask: torch.Tensor) -> OutputRows:
    """The layout of ``output`` (a forward's output over a micro-batch with
    ``attention_mask`` (B, T)): (B, T, ...) is padded, (1, N, ...) with N the number of
    attended tokens is packed (for B = 1 without padding both read the same). Any other
    shape is a ``CreditError`` naming both."""
    B, T = attention_mask.shape
    if output.dim() >= 2 and tuple(output.shape[:2]) == (B, T):
        return OutputRows(packed=False, rank=None)
    attended = attention_mask.bool()
    N = int(attended.sum())
    if output.dim() >= 2 and tuple(output.shape[:2]) == (1, N):
        return OutputRows(packed=True, rank=packed_rank(attention_mask.cpu()))
    raise CreditError(
        f"forward output: expected shape (B={B}, T={T}, ...) or, packed, (1, N={N}, ...) "
        f"(the attended tokens of attention_mask), got {tuple(output.shape)}"
    )


def packed_rank(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) long: each attended position's index in the packed row (row-major order, as
    ``unpad_input`` orders its ``indices``), -1 on the others."""
    attended = attention_mask.bool()
    rank = attended.flatten().long().cumsum(0).view_as(attended) - 1
    return rank.masked_fill_(~attended, -1)


def to_padded(values: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """A packed output ``values`` (1, N, ...) scattered to the padded layout (B, T, ...),
    0 off the attended positions (OpenRLHF's ``gather_and_pad_tensor`` without ring
    attention); a (B, T, ...) ``values`` is returned as it is."""
    rows = output_rows(values, attention_mask)
    if not rows.packed:
        return values
    B, T = attention_mask.shape
    out = values.new_zeros(B * T, *values.shape[2:])
    out[attention_mask.bool().flatten().to(values.device)] = values[0]
    return out.view(B, T, *values.shape[2:])
