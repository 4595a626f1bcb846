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

Against the whole-response mean, the suffix returns G_t of a correct response shrink toward
its late tokens and fall below mean_g G_0 there, so those tokens get negative advantage
whatever they did. ``group_step_advantages`` is the other published route, DeepSeekMath's
process supervision (Shao et al., 2024, arXiv 2402.03300, section 4.1.3): every token's
reward is normalised by the mean and std of all token rewards of its group, then summed to
go, A_t = sum_{k >= t} (r_k - mean_g r) / (std_g r + eps). A suffix is measured against as
many mean token rewards as it holds tokens, so tokens of the group's mean reward add 0
wherever they sit, and a response's late tokens are not charged for its early gains. With
rewards given at some tokens only (``given``: the ends of a user's reasoning steps,
``credit_core.given_rewards``), the mean and std are those of the given rewards and the sum
runs over the given positions, DeepSeekMath's form for step rewards.
"""

from __future__ import annotations

import torch

from credit_core.errors import CreditError
from credit_core.strategy import CreditResult, CriticRewardForm
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
    r = _check_token_rewards(token_rewards, mask, groups)
    G = returns_to_go(r, mask)
    first = mask.to(torch.int64).argmax(dim=1)
    total = G.gather(1, first.unsqueeze(1)).squeeze(1)
    index = _group_index(groups)
    n_groups = int(index.max()) + 1
    count = torch.zeros(n_groups, dtype=torch.float64, device=r.device).index_add_(
        0, index, torch.ones_like(total)
    )
    mean = torch.zeros_like(count).index_add_(0, index, total) / count
    dev = total - mean[index]
    var = torch.zeros_like(count).index_add_(0, index, dev * dev) / (count - 1)
    std = var.sqrt()[index]
    adv = (G - mean[index].unsqueeze(1)) / (std + eps).unsqueeze(1)
    adv = torch.where(mask & (std > 0).unsqueeze(1), adv, 0.0)
    return adv.to(torch.float32)


def group_step_advantages(
    token_rewards: torch.Tensor,
    mask: torch.Tensor,
    groups: torch.Tensor,
    *,
    given: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Token advantages (B, T) float32, 0 at padding: A_t = sum_{k >= t, k given} r~_k with
    r~_k = (r_k - mean_g r) / (std_g r + eps), mean and std (Bessel) over the rewards given
    in the row's group (module docstring; docs/design.md, "Token rewards to advantages").
    ``given`` (B, T) bool, a subset of ``mask``: where a reward is given (DeepSeekMath's step
    ends; None: every valid token). A group whose given rewards are all equal, or that has
    fewer than two, gets A = 0.

    ``mask`` (B, T) bool with >= 1 valid token per row; ``groups`` (B,) int64 group ids, each
    group holding >= 2 responses. Raises ``CreditError`` naming a bad tensor or a group of one.
    """
    if given is None:
        given = mask
    r = _check_token_rewards(token_rewards, mask, groups, given)
    index = _group_index(groups)
    r64 = torch.where(given, r.to(torch.float64), 0.0)
    n_groups = int(index.max()) + 1
    count = torch.zeros(n_groups, dtype=torch.float64, device=r.device).index_add_(
        0, index, given.sum(dim=1).to(torch.float64)
    )
    mean = torch.zeros_like(count).index_add_(0, index, r64.sum(dim=1)) / count.clamp_min(1.0)
    dev = torch.where(given, r64 - mean[index].unsqueeze(1), 0.0)
    square = torch.zeros_like(count).index_add_(0, index, (dev * dev).sum(dim=1))
    var = torch.where(count >= 2, square / (count - 1).clamp_min(1.0), 0.0)
    std = var.sqrt()[index]
    normalised = dev / (std + eps).unsqueeze(1)
    adv = torch.where((std > 0).unsqueeze(1), returns_to_go(normalised, mask), 0.0)
    return adv.to(torch.float32)


def _check_token_rewards(
    token_rewards: torch.Tensor,
    mask: torch.Tensor,
    groups: torch.Tensor,
    given: torch.Tensor | None = None,
) -> torch.Tensor:
    """``token_rewards`` (B, T) floating, finite at ``given`` (B, T) bool (default ``mask``),
    a subset of ``mask`` (B, T) bool; ``groups`` (B,) int64; all on one device.
    ``CreditError`` naming the bad tensor."""
    r = check_tensor("token_rewards", token_rewards, (None, None), floating=True)
    B, T = r.shape
    check_tensor("mask", mask, (B, T), dtype=torch.bool, device=r.device)
    check_tensor("groups", groups, (B,), dtype=torch.long, device=r.device)
    if given is None:
        given = mask
    check_tensor("given", given, (B, T), dtype=torch.bool, device=r.device)
    outside = torch.nonzero((given & ~mask).any(dim=1)).flatten()
    if outside.numel() > 0:
        raise CreditError(
            f"given: expected rewards given at valid tokens only, rows {outside.tolist()} "
            "give one at padding"
        )
    if not bool(torch.isfinite(torch.where(given, r, 0.0)).all()):
        raise CreditError("token_rewards: expected finite values at the valid tokens")
    return r


def _group_index(groups: torch.Tensor) -> torch.Tensor:
    """Each response's group as 0 .. n_groups - 1 (B,); ``CreditError`` naming any group of
    one response."""
    index: torch.Tensor = torch.unique(groups, return_inverse=True)[1]
    count = torch.bincount(index)
    if bool((count < 2).any()):
        lone = torch.unique(groups[(count < 2)[index]]).tolist()
        raise CreditError(f"groups: every group needs >= 2 responses, groups {lone} have one")
    return index


def critic_reward_shift(
    result: CreditResult,
    advantages: torch.Tensor,
    rewards: torch.Tensor,
    groups: torch.Tensor,
    mask: torch.Tensor,
    form: CriticRewardForm,
    *,
    name: str = "strategy",
) -> torch.Tensor:
    """D (B, T) float32, 0 at padding: what a strategy's credit adds to the outcome token
    rewards R_i 1[t = T_i] that a critic estimator (PPO's GAE) reads (docs/design.md, "Credit
    under a critic").

    - ``form == "weights"``: D_t = (R_i - mean_g R) (w_t - 1) / n_i with w_t = A_t / A_i the
      strategy's mean-preserving weights (``result.token_advantages`` over ``advantages``
      (B,), GRPO's response advantages they were formed from; D = 0 where A_i = 0). The
      group deviation of the reward, whose sign w was formed with, moves between tokens;
      sum_t D_t = 0, so the total token reward stays R_i (the sum-preserving twin of the
      mean-preserving contract), and ``uniform`` (w = 1) adds exactly 0.
    - ``form == "token_rewards"``: D_t = r_t - R_i 1[t = T_i], the paper form's own token
      rewards (``result.token_rewards``) in place of the outcome reward.

    ``rewards`` (B,), ``groups`` (B,) int64 with >= 2 responses per group, ``mask`` (B, T)
    bool right-padded with >= 1 valid token per row. Raises ``CreditError`` when a
    ``weights`` strategy's advantages change a response's mean (relative 1e-4), or a
    ``token_rewards`` result carries none.
    """
    B, T = mask.shape
    check_tensor("mask", mask, (None, None), dtype=torch.bool)
    device = mask.device
    check_tensor("advantages", advantages, (B,), floating=True, device=device)
    check_tensor("rewards", rewards, (B,), floating=True, device=device)
    check_tensor("groups", groups, (B,), dtype=torch.long, device=device)
    check_tensor("token_advantages", result.token_advantages, (B, T), device=device)
    R = rewards.to(torch.float64)
    positions = torch.arange(T, device=device).expand(B, T)
    last = positions == torch.where(mask, positions, -1).max(dim=1).values.unsqueeze(1)
    if form == "token_rewards":
        if result.token_rewards is None:
            raise CreditError(
                f"{name}: a paper-form strategy must return its token rewards "
                "(CreditResult.token_rewards) to run under a critic estimator"
            )
        r = check_tensor("token_rewards", result.token_rewards, (B, T), device=device)
        shift = r.to(torch.float64) - R.unsqueeze(1) * last
        return torch.where(mask, shift, 0.0).to(torch.float32)
    _, index = torch.unique(groups, return_inverse=True)
    count = torch.bincount(index).to(torch.float64)
    if bool((count < 2).any()):
        lone = torch.unique(groups[(count < 2)[index]]).tolist()
        raise CreditError(
            f"groups: the group deviation of the reward needs >= 2 responses per group, "
            f"groups {lone} have one"
        )
    deviation = R - (torch.bincount(index, weights=R) / count)[index]
    a = advantages.to(torch.float64).unsqueeze(1)
    w = torch.where(a != 0, result.token_advantages.to(torch.float64) / a.where(a != 0, 1.0), 1.0)
    w = torch.where(mask, w, 1.0)
    n = mask.sum(dim=1).to(torch.float64)
    drift = (w - 1.0).sum(dim=1) / n
    bad = drift.abs() > 1e-4
    if bool(bad.any()):
        raise CreditError(
            f"{name}: its critic_reward_form is 'weights', but its token advantages change the "
            f"mean of rows {torch.nonzero(bad).flatten().tolist()} (mean A_t / A_i - 1 up to "
            f"{float(drift.abs().max()):.3g}); a critic estimator needs weights of mean 1"
        )
    shift = deviation.unsqueeze(1) * (w - 1.0) / n.unsqueeze(1)
    return torch.where(mask, shift, 0.0).to(torch.float32)
