"""Token rewards to token advantages for a critic-free (GRPO) update: the route of the
paper-form baselines (docs/design.md, "Token rewards to advantages").

A paper-form strategy gives each valid token a reward r_t (RED's prefix-score differences,
ABC's attention share of R plus the terminal reward, P2T's attribution); GRPO has no critic,
so the rewards become advantages by their return-to-go with the group's baseline:

    G_t = sum_{k >= t} r_k                         (gamma = 1, over the row's valid tokens)
    A_t = (G_t - mean_g G_0) / (std_g G_0 + eps)   (std with Bessel's correction)

G_0 is a response's total token reward; mean and std are taken over the responses of its
group. When every token reward sits at the last valid token (r_t = R 1[t = T]), G_t = R at
every t and A_t is GRPO's (R - mean_g R) / (std_g R + eps) on every token. A group whose
responses share one total (std exactly 0, e.g. all correct) gets A = 0, as in GRPO: there is
no outcome difference to learn from, and the within-response differences are not rescaled by
1 / eps.
"""

from __future__ import annotations

import torch

from credit_core.errors import CreditError
from credit_core.tensor_checks import check_tensor


def returns_to_go(token_rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """G_t = sum_{k >= t, k valid} r_k (B, T) float64, 0 at padding, for rewards (B, T)."""
    r = torch.where(mask, token_rewards.to(torch.float64), 0.0)
    tail = r.flip(1).cumsum(1).flip(1)
    return torch.where(mask, tail, 0.0)


def group_return_advantages(
    token_rewards: torch.Tensor,
    mask: torch.Tensor,
    groups: torch.Tensor,
    *,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Token advantages (B, T) float32 from token rewards (B, T) (module docstring).

    ``mask`` (B, T) bool with >= 1 valid token per row; ``groups`` (B,) int64 group ids, each
    group holding >= 2 responses. Raises ``CreditError`` naming a bad tensor or a group of one.
    """
    r = check_tensor("token_rewards", token_rewards, (None, None), floating=True)
    B, T = r.shape
    check_tensor("mask", mask, (B, T), dtype=torch.bool, device=r.device)
    check_tensor("groups", groups, (B,), dtype=torch.long, device=r.device)
    if not bool(torch.isfinite(torch.where(mask, r, 0.0)).all()):
        raise CreditError("token_rewards: expected finite values at the valid tokens")
    G = returns_to_go(r, mask)
    first = mask.to(torch.int64).argmax(dim=1)
    total = G.gather(1, first.unsqueeze(1)).squeeze(1)
    _, index = torch.unique(groups, return_inverse=True)
    n_groups = int(index.max()) + 1
    count = torch.zeros(n_groups, dtype=torch.float64, device=r.device).index_add_(
        0, index, torch.ones_like(total)
    )
    if bool((count < 2).any()):
        lone = torch.unique(groups[(count < 2)[index]]).tolist()
        raise CreditError(f"groups: every group needs >= 2 responses, groups {lone} have one")
    mean = torch.zeros_like(count).index_add_(0, index, total) / count
    dev = total - mean[index]
    var = torch.zeros_like(count).index_add_(0, index, dev * dev) / (count - 1)
    std = var.sqrt()[index]
    adv = (G - mean[index].unsqueeze(1)) / (std + eps).unsqueeze(1)
    adv = torch.where(mask & (std > 0).unsqueeze(1), adv, 0.0)
    return adv.to(torch.float32)
