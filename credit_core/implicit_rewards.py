"""PRIME: implicit process rewards from a language model trained online on the outcomes (Cui
et al., 2025, "Process Reinforcement through Implicit Rewards", arXiv 2502.01456; the recipe
``recipe/prime`` of verl; docs/design.md, "Implicit process rewards (PRIME)").

An implicit PRM pi_phi, initialised from the reference policy pi_ref, scores each sampled
token by the log ratio q_t = log pi_phi(y_t | y_<t) - log pi_ref(y_t | y_<t); the implicit
process reward is r_t = beta q_t. pi_phi is trained on the step's rollouts with the outcome
labels l_i in [0, 1] by the cross-entropy of sigmoid(beta sum_t q_t) (``implicit_prm_loss``);
the backend that hosts pi_phi does that (``ImplicitPRM``), this module only does the tensor
algebra. The token rewards become token advantages by the recipe's combination
(``prime_advantages``): leave-one-out baselines of the implicit rewards and of the outcome
reward, summed with their coefficients, returns-to-go, whitened over the step's batch.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from credit_core.allocation import weight_diagnostics
from credit_core.batch import CreditBatch, Gather
from credit_core.errors import CreditError
from credit_core.strategy import CreditResult, CreditStrategy, CriticRewardForm, builtin
from credit_core.tensor_checks import check_tensor
from credit_core.trained_model import ImplicitPRMSpec

#: The floor of the batch-norm divisor (the recipe's ``prime_norm``: max |G| + 1e-6).
NORM_EPS = 1e-6
#: Inside the whitening's inverse square root (verl's ``masked_whiten``: rsqrt(var + 1e-8)).
WHITEN_EPS = 1e-8
#: The moments each process contributes to the step-wide normalizations (see
#: ``prime_advantages``): count, sum X, sum Y, sum X^2, sum Y^2, sum XY, max |G|.
_MOMENTS = 7


def implicit_token_rewards(
    log_ratio: torch.Tensor, mask: torch.Tensor, beta: float
) -> torch.Tensor:
    """r_t = beta q_t (B, T) float64 at the valid tokens of ``mask`` (B, T) bool, except the
    last valid token of each row, whose implicit reward is 0 (the recipe's token granularity
    fills positions ``:len - 1``: the outcome reward sits on the last token); 0 at padding.

    ``log_ratio`` (B, T) floating: q_t = log pi_phi(y_t) - log pi_ref(y_t), finite at the
    valid tokens.
    """
    q = check_tensor("implicit_log_ratio", log_ratio, (None, None), floating=True)
    B, T = q.shape
    check_tensor("mask", mask, (B, T), dtype=torch.bool, device=q.device)
    if not bool(torch.isfinite(torch.where(mask, q, 0.0)).all()):
        raise CreditError("implicit_log_ratio: expected finite values at the valid tokens")
    last = _last_valid(mask)
    cols = torch.arange(T, device=q.device).unsqueeze(0)
    keep = mask & (cols != last.unsqueeze(1))
    return torch.where(keep, beta * q.to(torch.float64), 0.0)


def _last_valid(mask: torch.Tensor) -> torch.Tensor:
    """(B,) int64: the column of each row's last valid token."""
    T = mask.shape[1]
    cols = torch.arange(T, device=mask.device).expand_as(mask)
    return torch.where(mask, cols, -1).amax(dim=1)


def _group_index(groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(index (B,) of each row's group in 0..n_groups-1, size (n_groups,) float64); a group
    of one response raises ``CreditError`` (a leave-one-out baseline needs two)."""
    _, index = torch.unique(groups, return_inverse=True)
    size = torch.bincount(index).to(torch.float64)
    if bool((size < 2).any()):
        lone = torch.unique(groups[(size < 2)[index]]).tolist()
        raise CreditError(f"groups: every group needs >= 2 responses, groups {lone} have one")
    return index, size


def leave_one_out(values: torch.Tensor, mask: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """The recipe's ``masked_rloo`` (B, T) float64: with m_i the mean of row i's values over
    its valid tokens and n the size of its group g,

        v~_t = (n v_t - sum_{j in g} m_j) / (n - 1)   at the valid tokens, 0 elsewhere.

    For one value per row (the outcome reward on the last token) it is R_i - mean_{j != i} R_j.
    """
    v = torch.where(mask, values.to(torch.float64), 0.0)
    index, size = _group_index(groups)
    m = v.sum(dim=1) / mask.sum(dim=1).to(torch.float64)
    total = torch.zeros_like(size).index_add_(0, index, m)
    n = size[index].unsqueeze(1)
    out = (n * v - total[index].unsqueeze(1)) / (n - 1.0)
    return torch.where(mask, out, 0.0)


def _returns(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, rewards, 0.0).flip(1).cumsum(1).flip(1)


def prime_advantages(
    token_rewards: torch.Tensor,
    mask: torch.Tensor,
    rewards: torch.Tensor,
    groups: torch.Tensor,
    *,
    implicit_coef: float,
    outcome_coef: float,
    batch_norm: bool,
    gather: Gather | None = None,
) -> torch.Tensor:
    """PRIME's token advantages (B, T) float32 (0 at padding), the recipe's
    ``compute_rloo_advantage_return`` with its ``prime_norm``:

        r'_t  = r_t / (max_{i, t} |sum_{k >= t} r^i_k| + 1e-6)    (``batch_norm``; else r_t)
        f_t   = implicit_coef LOO(r')_t + outcome_coef LOO(R)_i 1[t = last valid]
        G_t   = sum_{k >= t} f_k                                  (gamma = 1)
        A_t   = (G_t - mu) / sqrt(sigma^2 + 1e-8)

    LOO is ``leave_one_out``; mu and sigma^2 (Bessel's correction) are taken over every valid
    token of the step's batch, and so is the max of the batch norm: over the rows of this
    call and, through ``gather`` (one call), those of the step's other processes.

    ``token_rewards`` (B, T) floating, finite at the valid tokens (``implicit_token_rewards``);
    ``mask`` (B, T) bool, >= 1 valid token per row; ``rewards`` (B,) floating finite: the
    outcome rewards R_i; ``groups`` (B,) int64, each group >= 2 responses. The normalizations
    are exact sums over the step: each process contributes its count, sums, sums of squares
    and cross products of X = G(LOO(r)) and Y = G(LOO(R) 1[last]) (G = returns, linear in
    the rewards, so G_t = implicit_coef X_t / M + outcome_coef Y_t) and its max |G(r)|.
    """
    r = check_tensor("token_rewards", token_rewards, (None, None), floating=True)
    B, T = r.shape
    dev = r.device
    check_tensor("mask", mask, (B, T), dtype=torch.bool, device=dev)
    check_tensor("rewards", rewards, (B,), floating=True, device=dev)
    check_tensor("groups", groups, (B,), dtype=torch.long, device=dev)
    if not bool(mask.any(dim=1).all()):
        raise CreditError("mask: every response needs at least one valid token")
    r64 = torch.where(mask, r.to(torch.float64), 0.0)
    if not bool(torch.isfinite(r64).all()):
        raise CreditError("token_rewards: expected finite values at the valid tokens")
    last = _last_valid(mask)
    outcome = torch.zeros(B, T, dtype=torch.float64, device=dev)
    outcome[torch.arange(B, device=dev), last] = rewards.to(torch.float64)
    at_last = torch.zeros_like(mask)
    at_last[torch.arange(B, device=dev), last] = True
    x = _returns(leave_one_out(r64, mask, groups), mask)
    y = _returns(leave_one_out(outcome, at_last, groups), mask)
    xv, yv = x[mask], y[mask]
    local = torch.stack(
        [
            torch.tensor(float(xv.numel()), dtype=torch.float64, device=dev),
            xv.sum(),
            yv.sum(),
            (xv * xv).sum(),
            (yv * yv).sum(),
            (xv * yv).sum(),
            _returns(r64, mask).abs().amax(),
        ]
    )
    moments = local if gather is None else gather(local)
    if moments.numel() % _MOMENTS:
        raise CreditError(
            f"gather: expected {_MOMENTS} moments per process, got {moments.numel()} values"
        )
    per_process = moments.to(torch.float64).reshape(-1, _MOMENTS)
    n, sx, sy, sxx, syy, sxy = per_process[:, :6].sum(dim=0).tolist()
    norm = float(per_process[:, 6].max()) + NORM_EPS if batch_norm else 1.0
    if n < 2:
        raise CreditError(
            f"mask: whitening over the step needs >= 2 valid tokens, the step has {int(n)}"
        )
    a, b = implicit_coef / norm, outcome_coef
    mean = (a * sx + b * sy) / n
    second = (a * a * sxx + 2 * a * b * sxy + b * b * syy) / n
    var = max(second - mean * mean, 0.0) * n / (n - 1.0)
    adv = (a * x + b * y - mean) / (var + WHITEN_EPS) ** 0.5
    return torch.where(mask, adv, 0.0).to(torch.float32)


def implicit_prm_loss(
    log_ratio: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor, beta: float
) -> torch.Tensor:
    """Per-response cross-entropy (B,) of the implicit PRM (the recipe's
    ``compute_ce_dpo_loss_rm``, before its mean): with s_i = beta sum_{t valid} q_t,

        loss_i = -(l_i log sigmoid(s_i) + (1 - l_i) log(1 - sigmoid(s_i)))

    computed from the logit s_i (``binary_cross_entropy_with_logits``, stable where the
    sigmoid saturates). ``log_ratio`` (B, T) q_t (differentiable in log pi_phi), ``mask``
    (B, T) bool, ``labels`` (B,) in [0, 1]. Dtype of ``log_ratio``.
    """
    q = check_tensor("log_ratio", log_ratio, (None, None), floating=True)
    B, T = q.shape
    check_tensor("mask", mask, (B, T), dtype=torch.bool, device=q.device)
    check_tensor("labels", labels, (B,), floating=True, device=q.device)
    if not bool(((labels >= 0) & (labels <= 1)).all()):
        raise CreditError(f"labels: expected values in [0, 1], got {labels.tolist()}")
    score = beta * torch.where(mask, q, 0.0).sum(dim=1)
    return torch.nn.functional.binary_cross_entropy_with_logits(
        score, labels.to(score.dtype), reduction="none"
    )


class PrimeParams(BaseModel):
    """PRIME's parameters at the recipe's defaults (``recipe/prime/config/prime_trainer.yaml``:
    ``beta_train: 0.05``, ``reward_dpo_coef: 5``, ``reward_gt_coef: 5``, ``prime_norm:
    batch_norm``, pi_phi's ``optim.lr: 1e-6``, ``grad_clip: 10.0``) and the outcome labels'
    threshold (the recipe's verifier gives 0/1 accuracies: 1[R > 0] is that label)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    beta: float = Field(0.05, gt=0.0, allow_inf_nan=False, description="implicit reward scale")
    implicit_coef: float = Field(
        5.0, ge=0.0, allow_inf_nan=False, description="weight of the implicit rewards"
    )
    outcome_coef: float = Field(
        5.0, ge=0.0, allow_inf_nan=False, description="weight of the outcome reward"
    )
    norm: Literal["batch_norm", "none"] = Field(
        "batch_norm", description="divide the implicit rewards by the batch's max |return|"
    )
    threshold: float | None = Field(
        0.0, allow_inf_nan=False, description="label 1[R > threshold]; None: R is the label"
    )
    prm_lr: float = Field(1e-6, gt=0.0, allow_inf_nan=False, description="pi_phi's AdamW lr")
    prm_grad_clip: float = Field(
        10.0, gt=0.0, allow_inf_nan=False, description="pi_phi's gradient-norm clip"
    )


@builtin
class PrimeStrategy(CreditStrategy):
    """PRIME (module docstring; docs/design.md, "Implicit process rewards (PRIME)"): token
    advantages ``prime_advantages`` of the implicit rewards ``implicit_token_rewards`` of
    the ``implicit_log_ratio`` signal and of the outcome rewards. Ignores the response
    advantages A_i (the outcome enters through its own leave-one-out baseline); does not
    keep a response's mean advantage at A_i. Gathers once per call (the step-wide batch
    norm and whitening). The backend hosts and trains pi_phi (``implicit_prm``).
    Diagnostics describe A_t / A_i (1 where A_i = 0), as for ``ktae``."""

    name = "prime"
    requires = frozenset({"implicit_log_ratio"})
    Params: ClassVar[type[BaseModel]] = PrimeParams
    params: PrimeParams
    gathers = True

    @property
    def reads_groups(self) -> bool:
        return True

    @classmethod
    def critic_form(cls, params: BaseModel) -> CriticRewardForm | None:
        """None: PRIME's advantage is its own estimator (the implicit process rewards' and the
        outcome's returns with their own baselines), not a redistribution of the reward."""
        return None

    @property
    def implicit_prm(self) -> ImplicitPRMSpec | None:
        p = self.params
        return ImplicitPRMSpec(p.beta, p.prm_lr, p.prm_grad_clip, p.threshold)

    def assign_with_diagnostics(self, batch: CreditBatch) -> CreditResult:
        batch.require(self.requires, self.name)
        rewards, groups = batch.require_groups(self.name)
        p, mask = self.params, batch.mask
        assert batch.implicit_log_ratio is not None  # guaranteed by batch.require
        r = implicit_token_rewards(batch.implicit_log_ratio, mask, p.beta)
        adv = prime_advantages(
            r,
            mask,
            rewards,
            groups,
            implicit_coef=p.implicit_coef,
            outcome_coef=p.outcome_coef,
            batch_norm=p.norm == "batch_norm",
            gather=batch.gather,
        )
        a = batch.advantages.to(torch.float64).unsqueeze(1)
        w = torch.where(a != 0, adv.to(torch.float64) / torch.where(a != 0, a, 1.0), 1.0)
        w = torch.where(mask, w, 0.0)
        return CreditResult(adv, weight_diagnostics(w, mask, 0))
