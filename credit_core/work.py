"""DATC's per-token "work" W_t = <J_t u_t, d_t> in closed form.

docs/design.md, "DATC's score: work".
"""

from __future__ import annotations

import torch

from credit_core.batch import PolicyStats


def token_work(
    stats: PolicyStats,
    reward_grad: torch.Tensor,
    advantages: torch.Tensor | None,
) -> torch.Tensor:
    """W (B, T) float32 from policy stats and the reward gradient g (B, T, d).

    W_t = sign(A) * ( p_y (u_y - ubar) - (S - ubar * q) ) with u_y = E[y].g, ubar = m1.g,
    S = m2.g, q = sum p^2. ``advantages=None`` drops the sign(A) factor (``datc_nosign``).
    Computed in float32 (float64 if any input is float64); padded positions are not masked
    here.
    """
    dtype = torch.promote_types(
        torch.promote_types(reward_grad.dtype, stats.m1.dtype), torch.float32
    )
    g = reward_grad.to(dtype)
    u_y = (stats.sampled_emb.to(dtype) * g).sum(-1)
    ubar = (stats.m1.to(dtype) * g).sum(-1)
    S = (stats.m2.to(dtype) * g).sum(-1)
    p_y = stats.p_sampled.to(dtype)
    q = stats.p_sq.to(dtype)
    work = p_y * (u_y - ubar) - (S - ubar * q)
    if advantages is not None:
        work = work * torch.sign(advantages).to(dtype).unsqueeze(1)
    return work
