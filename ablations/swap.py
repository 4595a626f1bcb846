"""The exact-swap oracle of the credit probes: DATC's work with exact swap differences instead of
the first-order estimate.

docs/design.md, "Curvature-robust direction". The closed form of "DATC's score: work",
W_t = sign(A) (p_y (u_y - ubar) - sum_v p_v^2 (u_v - ubar)), depends on u only through
differences u_v - u_y (the softmax Jacobian removes constants). DATC estimates them to first
order, u_v - u_y = (E[v] - E[y]) . g; the oracle uses the exact differences
delta_v = R(y with y_t -> v) - R(y) of a reward model on a candidate set K' (the sampled
token, delta = 0, and the top-k other tokens by p_t), scored by the direction model without
gradient (``swap_deltas``: B x T x k RM forwards, in chunks). ``swap_work`` turns them into
the work. Tokens outside K' are given u_v = ubar (no information: they add nothing), which
makes ubar = sum_{K'} p_v delta_v / sum_{K'} p_v. With K' the whole vocabulary this is
DATC's work with exact differences: an upper bound for small settings, not a method.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from adapters.direction import DirectionModel


@dataclass(frozen=True)
class SwapDeltas:
    """Candidates of every response position and their exact swap differences.

    - ``candidates`` (B, T, K + 1) int64: slot 0 the sampled token, slots 1..K the K most
      probable other tokens under p_t.
    - ``probs`` (B, T, K + 1) float64: p_t of each candidate.
    - ``deltas`` (B, T, K + 1) float64: R(y with y_t -> candidate) - R(y); 0 in slot 0 and
      at padding.
    """

    candidates: torch.Tensor
    probs: torch.Tensor
    deltas: torch.Tensor


def top_candidates(
    probs: torch.Tensor, token_ids: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(candidates, their probabilities) (B, T, k + 1): the sampled token, then the k most
    probable other tokens of p_t (probs (B, T, V), token_ids (B, T), k < V)."""
    p = probs.to(torch.float64)
    others = p.scatter(2, token_ids.long().unsqueeze(2), -1.0)
    top = others.topk(k, dim=2).indices
    cand = torch.cat([token_ids.long().unsqueeze(2), top], dim=2)
    return cand, p.gather(2, cand)


@torch.no_grad()
def swap_deltas(
    model: DirectionModel,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    response_ids: torch.Tensor,
    response_mask: torch.Tensor,
    probs: torch.Tensor,
    k: int,
    *,
    chunk: int = 1024,
) -> SwapDeltas:
    """``SwapDeltas`` of a rollout batch (see module doc); probs (B, T, V) is p_t."""
    cand, cand_p = top_candidates(probs, response_ids, k)
    base = model.score(prompt_ids, prompt_mask, response_ids, response_mask, with_grad=False)
    r0 = base.rewards.to(torch.float64)
    rows, cols = torch.nonzero(response_mask != 0, as_tuple=True)
    n = rows.numel()
    b = rows.repeat_interleave(k)
    t = cols.repeat_interleave(k)
    device = response_ids.device
    slot = torch.arange(1, k + 1, device=device).repeat(n)
    swapped = response_ids[b].clone()
    swapped[torch.arange(b.numel(), device=device), t] = cand[b, t, slot]
    rewards = torch.empty(b.numel(), dtype=torch.float64, device=device)
    for start in range(0, b.numel(), chunk):
        sl = slice(start, start + chunk)
        out = model.score(
            prompt_ids[b[sl]],
            prompt_mask[b[sl]],
            swapped[sl],
            response_mask[b[sl]],
            with_grad=False,
        )
        rewards[sl] = out.rewards.to(device, torch.float64)
    deltas = torch.zeros(cand.shape, dtype=torch.float64, device=device)
    deltas[b, t, slot] = rewards - r0.to(device)[b]
    return SwapDeltas(cand, cand_p, deltas)


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
