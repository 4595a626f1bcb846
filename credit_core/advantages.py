"""Response-level advantage estimators over groups of G samples per prompt."""

from __future__ import annotations

from typing import Literal, get_args

import torch

from credit_core.errors import CreditError
from credit_core.tensor_checks import check_tensor

Estimator = Literal["group_norm", "dr_grpo", "rloo"]
ESTIMATORS: tuple[str, ...] = get_args(Estimator)


def group_advantages(
    rewards: torch.Tensor,
    group_size: int,
    estimator: str = "group_norm",
    eps: float = 1e-6,
) -> torch.Tensor:
    """Response advantages A (B,) from rewards (B,) ordered group by group.

    B = n_prompts * group_size; group k is ``rewards[k*G:(k+1)*G]``.

    - ``group_norm``: (r - mean_g) / (std_g + eps), std with Bessel's correction (GRPO).
    - ``dr_grpo``: r - mean_g (Dr. GRPO, no std division).
    - ``rloo``: r - mean of the other G-1 rewards of the group.

    Returns a tensor of the rewards' floating dtype (float32 for integer rewards).
    """
    check_tensor("rewards", rewards, (None,))
    if estimator not in ESTIMATORS:
        raise CreditError(f"estimator: expected one of {list(ESTIMATORS)}, got {estimator!r}")
    if not isinstance(group_size, int) or group_size < 2:
        raise CreditError(f"group_size: expected an integer >= 2, got {group_size!r}")
    if not eps >= 0:
        raise CreditError(f"eps: expected a value >= 0, got {eps!r}")
    B = rewards.shape[0]
    if B == 0 or B % group_size != 0:
        raise CreditError(
            f"rewards: expected a length that is a positive multiple of group_size={group_size}, "
            f"got {B}"
        )
    r = rewards if rewards.is_floating_point() else rewards.float()
    if not bool(torch.isfinite(r).all()):
        bad = torch.nonzero(~torch.isfinite(r)).flatten().tolist()
        raise CreditError(f"rewards: expected finite values, entries {bad} are not")
    groups = r.reshape(-1, group_size)
    mean = groups.mean(dim=1, keepdim=True)
    if estimator == "group_norm":
        adv = (groups - mean) / (groups.std(dim=1, keepdim=True) + eps)
    elif estimator == "dr_grpo":
        adv = groups - mean
    else:
        adv = (groups - mean) * (group_size / (group_size - 1))
    return adv.reshape(B)
