"""DATC's work with exact swap differences instead of the first-order estimate (an oracle).

docs/design.md, "Curvature-robust direction". The closed form of "DATC's score: work",
W_t = sign(A) (p_y (u_y - ubar) - sum_v p_v^2 (u_v - ubar)), depends on u only through
differences u_v - u_y (the softmax Jacobian removes constants). DATC estimates them to first
order, u_v - u_y = (E[v] - E[y]) . g; the oracle uses the exact differences
delta_v = R(y with y_t -> v) - R(y) on a candidate set K' (the sampled token, delta = 0, and
the top-k other tokens by p_t). Tokens outside K' are given u_v = ubar (no information:
they add nothing), which makes ubar = sum_{K'} p_v delta_v / sum_{K'} p_v. With K' the
whole vocabulary this is DATC's work with exact differences. It costs B x T x k RM
forwards: an upper bound for small settings, not a method.
"""

from __future__ import annotations

import torch


def swap_work(
    cand_probs: torch.Tensor, deltas: torch.Tensor, advantages: torch.Tensor | None
) -> torch.Tensor:
    """W (B, T) float64 from candidate probabilities and exact swap differences.

    cand_probs, deltas (B, T, K + 1): slot 0 is the sampled token (p_y, delta 0), slots
    1..K other tokens. ``advantages`` (B,) gives the sign(A) factor (None: without it).
    """
    p = cand_probs.to(torch.float64)
    u = deltas.to(torch.float64)
    mass = p.sum(dim=2).clamp(min=1e-300)
    ubar = (p * u).sum(dim=2) / mass
    work = p[..., 0] * (u[..., 0] - ubar) - (p * p * (u - ubar.unsqueeze(2))).sum(dim=2)
    if advantages is not None:
        work = work * torch.sign(advantages).to(torch.float64).unsqueeze(1)
    return work
