"""PPO's generalized advantage estimation over response tokens, and batch whitening.

docs/design.md, "PPO with a critic (GAE)". For one response with valid tokens t = 0..T-1
(a right-padded row of ``mask``), token rewards r_t and critic values V_t = V(s_t) (the
value of the state before token t):

    delta_t = r_t + gamma * V_{t+1} - V_t          (V_T = 0: the response ends at T - 1)
    A_t     = sum_{k >= t} (gamma * lam)^(k - t) * delta_k
    R_t     = A_t + V_t                            (the critic's regression target)

the recursion of verl's ``compute_gae_advantage_return`` and OpenRLHF's
``get_advantages_and_returns``, computed here as one product with the (T, T) matrix of
discounts instead of a loop over tokens. The advantages are then whitened over every valid
token of the step's batch, on all ranks (``whiten``; verl's ``masked_whiten``, the default
of verl and OpenRLHF for ``gae``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from credit_core import CreditError
from credit_core.tensor_checks import check_tensor

#: verl's ``masked_whiten`` adds this to the variance.
WHITEN_EPS = 1e-8

#: How the sums of a whitening reach every rank: ``DistContext.all_reduce_sum`` (float64).
ReduceSum = Callable[[torch.Tensor], torch.Tensor]


def _check_prefix_mask(mask: torch.Tensor) -> None:
    if bool((mask[:, 1:] & ~mask[:, :-1]).any()):
        rows = torch.nonzero((mask[:, 1:] & ~mask[:, :-1]).any(dim=1)).flatten().tolist()
        raise CreditError(
            f"mask: expected right-padded rows (valid tokens first, then padding); rows "
            f"{rows} have a valid token after padding"
        )


def outcome_token_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T) float32: each response's reward ``rewards`` (B,) at its last valid token of
    ``mask`` (B, T) bool, right-padded, at least one valid token per row; 0 elsewhere."""
    check_tensor("rewards", rewards, (None,))
    check_tensor("mask", mask, (rewards.shape[0], None), dtype=torch.bool, device=rewards.device)
    _check_prefix_mask(mask)
    lengths = mask.sum(dim=1)
    if bool((lengths == 0).any()):
        rows = torch.nonzero(lengths == 0).flatten().tolist()
        raise CreditError(f"mask: rows {rows} have no valid token to carry the reward")
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    return out.scatter(1, (lengths - 1).unsqueeze(1), rewards.float().unsqueeze(1))


def gae_advantages_and_returns(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE advantages A (B, T) and returns R = A + V (B, T), both float32 and exactly 0 at
    padding (module docstring), not whitened.

    ``token_rewards`` and ``values`` (B, T) floating (values at padding are ignored);
    ``mask`` (B, T) bool, right-padded; ``gamma``, ``lam`` in [0, 1]. No gradient flows.
    """
    check_tensor("token_rewards", token_rewards, (None, None), floating=True)
    shape = tuple(token_rewards.shape)
    dev = token_rewards.device
    check_tensor("values", values, shape, floating=True, device=dev)
    check_tensor("mask", mask, shape, dtype=torch.bool, device=dev)
    for name, value in (("gamma", gamma), ("lam", lam)):
        if not 0.0 <= value <= 1.0:
            raise CreditError(f"{name}: expected a value in [0, 1], got {value!r}")
    _check_prefix_mask(mask)
    T = shape[1]
    with torch.no_grad():
        m = mask.float()
        v = values.detach().float() * m
        r = token_rewards.detach().float() * m
        next_v = torch.cat([v[:, 1:], torch.zeros_like(v[:, :1])], dim=1)
        delta = (r + gamma * next_v - v) * m
        steps = torch.arange(T, device=dev)
        ahead = steps.unsqueeze(0) - steps.unsqueeze(1)  # [t, k] = k - t
        discount = torch.where(
            ahead >= 0,
            torch.tensor(gamma * lam, dtype=torch.float32, device=dev).pow(ahead.clamp_min(0)),
            torch.zeros((), dtype=torch.float32, device=dev),
        )
        advantages = delta @ discount.T
        return advantages, (advantages + v) * m


def whiten(advantages: torch.Tensor, mask: torch.Tensor, reduce_sum: ReduceSum) -> torch.Tensor:
    """(A - mean) / sqrt(var + 1e-8) over the valid tokens of the whole step, 0 at padding.

    ``advantages`` (B, T) floating, ``mask`` (B, T) bool: this rank's rows; ``reduce_sum``
    sums a float64 tensor over the ranks (the identity in one process). mean and the
    unbiased variance (Bessel's correction, as verl's ``masked_var``) are those of all
    ranks' valid tokens, so every rank whitens with the same statistics; at least two valid
    tokens in all. Returns float32.
    """
    check_tensor("advantages", advantages, (None, None), floating=True)
    check_tensor("mask", mask, tuple(advantages.shape), dtype=torch.bool, device=advantages.device)
    a = advantages.detach().double()
    m = mask.double()
    sums = reduce_sum(torch.stack([(a * m).sum(), m.sum()]))
    n = float(sums[1])
    if n < 2:
        raise CreditError(
            f"mask: whitening needs at least 2 valid tokens over the step's batch, got {n:g}"
        )
    mean = sums[0].to(a.device) / n
    centered = (a - mean) * m
    var = float(reduce_sum((centered * centered).sum().reshape(1))[0]) / (n - 1)
    return (centered / math.sqrt(var + WHITEN_EPS)).float()
