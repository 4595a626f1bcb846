"""``credit: process`` written out with loops, for the backends' tests (docs/design.md,
"User-given token rewards (process supervision)"): each response's token advantages
A_t = w A_i + sum over its steps ending at or after t of (r - mean_g) / (std_g + eps), mean
and std (Bessel) over the step rewards given in the response's group (no process term where
they are all equal), A_i the backend's own GRPO advantage of the outcomes (its std floor
``outcome_eps``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

#: ``ProcessParams.eps``: the floor of the step rewards' std.
PROCESS_EPS = 1e-6

Spans = Sequence[tuple[int, int, float]]


def process_advantages(
    steps: Sequence[Spans],
    outcomes: Sequence[float],
    lengths: Sequence[int],
    group_size: int,
    outcome_weight: float,
    *,
    outcome_eps: float,
) -> list[list[float]]:
    """Each response's token advantages (``lengths[b]`` of them), responses in consecutive
    groups of ``group_size``; ``steps[b]``: its (start, end, reward) spans, end exclusive."""
    out = []
    for b, n in enumerate(lengths):
        rows = range(b // group_size * group_size, (b // group_size + 1) * group_size)
        given = [r for k in rows for _, _, r in steps[k]]
        mean = sum(given) / len(given)
        std = (sum((r - mean) ** 2 for r in given) / (len(given) - 1)) ** 0.5
        r_mean = sum(outcomes[k] for k in rows) / group_size
        r_std = (sum((outcomes[k] - r_mean) ** 2 for k in rows) / (group_size - 1)) ** 0.5
        a_i = (outcomes[b] - r_mean) / (r_std + outcome_eps)
        out.append(
            [
                outcome_weight * a_i
                + (
                    sum((r - mean) / (std + PROCESS_EPS) for _, end, r in steps[b] if end > t)
                    if std > 0
                    else 0.0
                )
                for t in range(n)
            ]
        )
    return out


def halves(ids: Sequence[int]) -> list[tuple[int, int, float]]:
    """A response's two steps, its halves, scored by a rule on their end tokens (one step for
    a single token, none for an empty response)."""
    n = len(ids)
    half = max(n // 2, 1)
    spans = [(0, half, float(ids[half - 1] % 2))]
    if half < n:
        spans.append((half, n, float(ids[-1] % 3 == 0)))
    return spans if n else []


def halves_process(
    ids: torch.Tensor, mask: torch.Tensor, group_size: int, outcome_weight: float, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(R (B,), A (B, T) float64, 0 at padding) of ``halves`` on the right-padded ``ids``
    under ``mask``: R_i the sum of response i's step rewards, A ``process_advantages`` with
    the backend's GRPO std floor ``eps``."""
    B, T = mask.shape
    steps = [halves(ids[b][mask[b]].tolist()) for b in range(B)]
    R = [sum(r for _, _, r in s) for s in steps]
    lengths = [int(m.sum()) for m in mask]
    rows = process_advantages(steps, R, lengths, group_size, outcome_weight, outcome_eps=eps)
    A = torch.zeros(B, T, dtype=torch.float64)
    for b, row in enumerate(rows):
        A[b, : len(row)] = torch.tensor(row, dtype=torch.float64)
    return torch.tensor(R, dtype=torch.float64), A
