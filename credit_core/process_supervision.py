"""``process``: credit from the token rewards the user's reward function gives, by
DeepSeekMath's process supervision (Shao et al., 2024, arXiv 2402.03300, section 4.1.3;
docs/design.md, "User-given token rewards (process supervision)").

The reward function gives rewards r_k at some tokens (``TokenRewards``: every valid token,
or the last token of each reasoning step). Each given reward is normalised by the mean and
std (Bessel) of the rewards given in its response's group, and a token's process advantage
is the sum of the normalised rewards given at or after it; the outcome advantage A_i (the
backend's response advantage, GRPO's group-normalised R_i) is mixed in by a weight:

    A_t = outcome_weight A_i + process_weight sum_{k >= t, k given} r~_k
    r~_k = (r_k - mean_g r) / (std_g r + eps)

``outcome_weight = 0, process_weight = 1`` (the defaults) is the published process
supervision; ``outcome_weight = 1, process_weight = 0`` is GRPO (``uniform``) bit for bit.
Under a critic (``critic_reward_form == "token_rewards"``) the token rewards are the raw
ones with the same weights, process_weight r_k at each given k plus outcome_weight R_i at
the last valid token.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from credit_core.allocation import weight_diagnostics
from credit_core.baseline_strategies import last_valid
from credit_core.batch import CreditBatch
from credit_core.strategy import CreditResult, CreditStrategy, CriticRewardForm, builtin
from credit_core.token_rewards import group_step_advantages


class ProcessParams(BaseModel):
    """The weights of the outcome advantage and of the process advantage (both >= 0, not
    both 0) and the eps of the step-reward normalisation."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    outcome_weight: float = Field(
        0.0, ge=0.0, allow_inf_nan=False, description="weight of the outcome advantage A_i"
    )
    process_weight: float = Field(
        1.0, ge=0.0, allow_inf_nan=False, description="weight of the step rewards' sum to go"
    )
    eps: float = Field(1e-6, gt=0.0, allow_inf_nan=False, description="std floor of r~")

    @model_validator(mode="after")
    def _some_weight(self) -> ProcessParams:
        if self.outcome_weight == 0 and self.process_weight == 0:
            raise ValueError("outcome_weight and process_weight are both 0: no credit at all")
        return self


@builtin
class ProcessStrategy(CreditStrategy):
    """Process supervision on the user's token rewards (module docstring). Reads the token
    rewards (``reads_token_rewards``) and the groups; token advantages may change sign
    within a response and do not keep its mean at A_i. Diagnostics describe A_t / A_i (1
    where A_i = 0), as for the paper forms."""

    name = "process"
    Params: ClassVar[type[BaseModel]] = ProcessParams
    params: ProcessParams
    reads_token_rewards = True

    @property
    def reads_groups(self) -> bool:
        return True

    @classmethod
    def critic_form(cls, params: BaseModel) -> CriticRewardForm | None:
        """The user's token rewards, weighted (module docstring), whatever ``params``."""
        return "token_rewards"

    def assign_with_diagnostics(self, batch: CreditBatch) -> CreditResult:
        rewards, groups = batch.require_groups(self.name)
        given = batch.require_token_rewards(self.name)
        p, mask = self.params, batch.mask
        process = group_step_advantages(
            given.values, mask, groups, given=given.given, eps=p.eps
        ).to(torch.float64)
        a = batch.advantages.to(torch.float64).unsqueeze(1)
        adv = torch.where(mask, p.outcome_weight * a + p.process_weight * process, 0.0)
        w = torch.where(a != 0, adv / torch.where(a != 0, a, 1.0), 1.0)
        w = torch.where(mask, w, 0.0)
        outcome = rewards.to(torch.float64).unsqueeze(1) * last_valid(mask)
        token_rewards = p.process_weight * given.values + p.outcome_weight * outcome
        return CreditResult(
            adv.to(torch.float32),
            weight_diagnostics(w, mask, 0),
            torch.where(mask, token_rewards, 0.0),
        )
