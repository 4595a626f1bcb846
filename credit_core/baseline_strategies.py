"""Published token-credit baselines as strategies (docs/design.md, "Baselines").

- ``entropy_top``: the 80/20 rule (Wang et al., 2025, arXiv 2506.01939): only the tokens
  whose policy entropy reaches the batch's (1 - rho) quantile carry the advantage.
- ``random_top``: its control, a uniformly random selection of the same share.
- ``abc``: attention-based credit (Chan et al., 2024, arXiv 2402.00782), in its
  mean-preserving form w_t = (1 - beta) + beta T alpha_t, or (``mode: paper``) its token
  reward beta R alpha_t + (1 - beta) R 1[t = T].
- ``red``: reward redistribution from prefix scores (Li et al., 2024, arXiv 2411.08302), in
  this library's mean form w_t proportional to max(sign(A) r_t, 0) + eps, or (``mode:
  paper``) its token reward r_t itself.

The mean forms of ``red`` and ``p2t`` (``TokenRewardParams``) allocate by this library's
``aligned`` rule (above) or, with ``allocation: softmax_floor``, by DATC's own rule
(``credit_core.allocation.allocate_weights`` on s_t = sign(A) r_t, same beta and lam): the
matched-allocation control, under which only the signal differs from DATC's.

Every weight form keeps the sign of A and its per-response mean (w >= 0, mean 1 over a
response's valid tokens); ``mask`` mode of the two selections is the published A_t = A M_t,
which does not, and neither do the paper forms: their token rewards become advantages
through ``credit_core.token_rewards.group_return_advantages`` or, with ``paper_route:
step_norm``, ``group_step_advantages`` (negative credit allowed).
A response for which a method has no signal gets w = 1 and is counted in
``CreditDiagnostics.uniform_fallbacks``.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import ClassVar, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from credit_core.allocation import allocate_weights, weight_diagnostics
from credit_core.batch import CreditBatch
from credit_core.strategy import (
    CreditResult,
    CreditStrategy,
    CriticRewardForm,
    SeededStream,
    builtin,
)
from credit_core.tensor_checks import check_finite_at
from credit_core.token_rewards import group_return_advantages, group_step_advantages
from credit_core.token_selection import top_fraction

SelectionMode = Literal["mask", "weight"]
#: ``mean``: the mean-preserving weight form; ``paper``: the published token reward, turned
#: into advantages within each group (docs/design.md, "Token rewards to advantages").
RewardForm = Literal["mean", "paper"]
#: How a paper form's token rewards become advantages: ``group_returns``, returns-to-go
#: against the group's mean total (``group_return_advantages``); ``step_norm``, each token
#: reward normalised over its group's token rewards, then summed to go
#: (``group_step_advantages``; docs/design.md, "Token rewards to advantages").
PaperRoute = Literal["group_returns", "step_norm"]
#: How a mean form turns a token reward r_t into weights: ``aligned``, this library's
#: w_t proportional to max(sign(A) r_t, 0) + eps; ``softmax_floor``, DATC's allocation of
#: s_t = sign(A) r_t (docs/design.md, "From one advantage to many").
Allocation = Literal["aligned", "softmax_floor"]


class TopFractionParams(BaseModel):
    """Parameters of a top-fraction selection: the share ``rho`` of the batch's valid tokens
    kept, and what is done with the selection M (``mode``): ``mask`` A_t = A M_t (the
    published method), ``weight`` w_t = M_t n / sum_t M_t (sign and mean of A kept)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    rho: float = Field(0.2, gt=0.0, le=1.0, description="share of the batch's tokens kept")
    mode: SelectionMode = Field("mask", description="mask: A_t = A M_t; weight: mean-keeping")


class RandomTopParams(TopFractionParams):
    """``TopFractionParams`` plus the seed of the random keys."""

    seed: int = Field(0, ge=0, description="seed of the key generator")


def _result(batch: CreditBatch, weights: torch.Tensor, uniform_fallbacks: int) -> CreditResult:
    """A = A_i w_t (B, T) float32 for weights (B, T) that are 0 at padding."""
    adv = batch.advantages.to(torch.float64).unsqueeze(1) * weights
    diag = weight_diagnostics(weights, batch.mask, 0, uniform_fallbacks)
    return CreditResult(adv.to(torch.float32), diag)


def paper_result(
    batch: CreditBatch,
    token_rewards: torch.Tensor,
    fallbacks: int,
    route: PaperRoute = "group_returns",
) -> CreditResult:
    """The paper-form route: token rewards (B, T) -> advantages within the batch's groups
    (``group_return_advantages``, or ``group_step_advantages`` for ``route="step_norm"``).
    Diagnostics describe the effective weights A_t / A_i (1 where A_i = 0), which may be
    negative."""
    _, groups = batch.require_groups("paper form")
    to_advantages = group_step_advantages if route == "step_norm" else group_return_advantages
    adv = to_advantages(token_rewards, batch.mask, groups)
    a = batch.advantages.to(torch.float64).unsqueeze(1)
    w = torch.where(a != 0, adv.to(torch.float64) / torch.where(a != 0, a, 1.0), 1.0)
    w = torch.where(batch.mask, w, 0.0)
    r = torch.where(batch.mask, token_rewards.to(torch.float64), 0.0)
    return CreditResult(adv, weight_diagnostics(w, batch.mask, 0, fallbacks), r)


def last_valid(mask: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: True at each row's last valid token."""
    T = mask.shape[1]
    positions = torch.arange(T, device=mask.device).expand_as(mask)
    last = torch.where(mask, positions, -1).max(dim=1).values
    return positions == last.unsqueeze(1)


def mean_one(raw: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights (B, T) float64 = raw n / sum(raw) over each row's valid tokens, 0 at padding,
    for raw (B, T) >= 0; a row whose raw values sum to 0 gets w = 1. Returns the weights
    and the bool (B,) of those uniform rows."""
    raw = torch.where(mask, raw.to(torch.float64), 0.0)
    total = raw.sum(dim=1)
    empty = total <= 0
    n = mask.sum(dim=1).to(torch.float64)
    w = raw * (n / torch.where(empty, 1.0, total)).unsqueeze(1)
    return torch.where(mask, torch.where(empty.unsqueeze(1), 1.0, w), 0.0), empty


def aligned_result(batch: CreditBatch, token_rewards: torch.Tensor, eps: float) -> CreditResult:
    """The mean-preserving form of a token reward r (B, T): w_t proportional to
    max(sign(A) r_t, 0) + ``eps``, rescaled to mean 1 over each response's valid tokens
    (``mean_one``), A_t = A w_t. A response whose r_t all oppose sign(A) (none > 0 after the
    sign) gets uniform weights from the floor and is counted in ``uniform_fallbacks``; A = 0
    gives w = 1 (uncounted)."""
    mask = batch.mask
    sign = torch.sign(batch.advantages.to(torch.float64)).unsqueeze(1)
    aligned = (sign * token_rewards.to(torch.float64)).clamp_min(0.0)
    unaligned = ~torch.where(mask, aligned > 0, False).any(dim=1)
    weights, _ = mean_one(aligned + eps, mask)
    return _result(batch, weights, int((unaligned & (sign[:, 0] != 0)).sum()))


def softmax_floor_result(
    batch: CreditBatch, token_rewards: torch.Tensor, beta: float, lam: float, name: str
) -> CreditResult:
    """The matched-allocation form of a token reward r (B, T): DATC's allocation
    (``allocate_weights``, beta, lam) of the scores s_t = sign(A) r_t, A_t = A w_t. Sign and
    per-response mean of A kept; A = 0 or constant r gives w = 1. A non-finite r at a valid
    token is a ``CreditError`` naming ``name``'s scores."""
    sign = torch.sign(batch.advantages.to(torch.float64)).unsqueeze(1)
    scores = sign * token_rewards.to(torch.float64)
    weights, diag = allocate_weights(
        scores, batch.mask, beta=beta, lam=lam, on_nonfinite="error", score_name=f"{name} scores"
    )
    adv = batch.advantages.to(weights.dtype).unsqueeze(1) * weights
    return CreditResult(adv.to(torch.float32), diag)


class TokenRewardParams(BaseModel):
    """Parameters of a baseline whose signal is a token reward r_t (``red``, ``p2t``).

    - ``mode``: ``mean``, weights that keep the sign and per-response mean of A; ``paper``,
      r_t turned into advantages within the group by ``paper_route``.
    - ``allocation`` (mean mode): ``aligned``, this library's mean form, w_t proportional to
      max(sign(A) r_t, 0) + ``eps`` (``eps`` on the reward's scale: a token against the
      advantage's sign keeps a small weight, not 0); ``softmax_floor``, DATC's allocation of
      s_t = sign(A) r_t with ``beta`` and ``lam`` (the matched-allocation control).
    - ``paper_route`` (paper mode): ``group_returns`` or ``step_norm`` (``PaperRoute``).

    A parameter the chosen form does not read is refused when given (``beta`` and ``lam``
    outside ``softmax_floor``, ``eps`` outside ``aligned``, ``paper_route`` in mean mode,
    ``allocation`` in paper mode).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    mode: RewardForm = Field("mean", description="mean: mean-preserving weights; paper: reward")
    eps: float = Field(1e-6, gt=0.0, allow_inf_nan=False, description="floor of each weight")
    allocation: Allocation = Field("aligned", description="mean mode: aligned or softmax_floor")
    beta: float = Field(1.0, gt=0.0, allow_inf_nan=False, description="softmax_floor temperature")
    lam: float = Field(0.5, ge=0.0, le=1.0, description="softmax_floor mixing with uniform")
    paper_route: PaperRoute = Field("group_returns", description="paper mode: advantage route")

    @model_validator(mode="after")
    def _read(self) -> TokenRewardParams:
        unread: set[str] = set()
        if self.mode == "paper":
            unread |= {"allocation", "beta", "lam", "eps"}
        else:
            unread.add("paper_route")
            unread.add("eps" if self.allocation == "softmax_floor" else "beta")
            if self.allocation == "aligned":
                unread.add("lam")
        given = sorted(unread & self.model_fields_set)
        if given:
            raise ValueError(
                f"{given} are not read with mode {self.mode!r}"
                + (f" and allocation {self.allocation!r}" if self.mode == "mean" else "")
            )
        return self

    def assign(self, batch: CreditBatch, token_rewards: torch.Tensor, name: str) -> CreditResult:
        """The credit of ``token_rewards`` (B, T), finite at valid tokens, by these params."""
        if self.mode == "paper":
            return paper_result(batch, token_rewards, 0, self.paper_route)
        if self.allocation == "softmax_floor":
            return softmax_floor_result(batch, token_rewards, self.beta, self.lam, name)
        return aligned_result(batch, token_rewards, self.eps)


class _TopFractionStrategy(CreditStrategy):
    """A strategy that selects a batch-wide top ``rho`` share of tokens by a per-token key."""

    Params: ClassVar[type[BaseModel]] = TopFractionParams
    params: TopFractionParams
    gathers = True

    @classmethod
    def critic_form(cls, params: BaseModel) -> CriticRewardForm | None:
        """``weight`` mode keeps each response's mean; ``mask`` (A_t = A M_t) drops credit,
        it does not move it, so a critic estimator cannot take it as token rewards."""
        assert isinstance(params, TopFractionParams)
        return "weights" if params.mode == "weight" else None

    @abstractmethod
    def keys(self, batch: CreditBatch) -> torch.Tensor:
        """Per-token keys (B, T); the largest are selected."""

    def assign_with_diagnostics(self, batch: CreditBatch) -> CreditResult:
        batch.require(self.requires, self.name)
        selected = top_fraction(self.keys(batch), batch, self.params.rho, f"{self.name} keys")
        if self.params.mode == "mask":
            return _result(batch, selected.to(torch.float64), 0)
        weights, empty = mean_one(selected.to(torch.float64), batch.mask)
        return _result(batch, weights, int(empty.sum()))


@builtin
class EntropyTopStrategy(_TopFractionStrategy):
    """The 80/20 rule: keep the tokens whose entropy H_t reaches the (1 - rho) quantile of
    H over the step's valid tokens (all processes); ``mode`` says what the selection does."""

    name = "entropy_top"
    requires = frozenset({"token_entropy"})

    def keys(self, batch: CreditBatch) -> torch.Tensor:
        entropy = batch.token_entropy
        assert entropy is not None  # guaranteed by batch.require
        return entropy


@builtin
class RandomTopStrategy(SeededStream, _TopFractionStrategy):
    """Control of ``entropy_top``: the same rule on uniform random keys, i.e. a uniformly
    random ``rho`` share of the step's tokens. Keys are drawn on the CPU from a generator
    seeded once (``seed``) that advances with every call."""

    name = "random_top"
    Params: ClassVar[type[BaseModel]] = RandomTopParams
    params: RandomTopParams

    def keys(self, batch: CreditBatch) -> torch.Tensor:
        keys = torch.rand(batch.mask.shape, generator=self.generator, dtype=torch.float64)
        return keys.to(batch.mask.device)


class ABCParams(BaseModel):
    """The share ``beta`` of the credit that follows the attention (0.5 in the paper);
    ``paper_route``: how the paper form's token rewards become advantages (``PaperRoute``),
    refused in mean mode."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    beta: float = Field(0.5, ge=0.0, le=1.0, description="share of credit set by attention")
    mode: RewardForm = Field("mean", description="mean: mean-preserving weights; paper: reward")
    paper_route: PaperRoute = Field("group_returns", description="paper mode: advantage route")

    @model_validator(mode="after")
    def _read(self) -> ABCParams:
        if self.mode == "mean" and "paper_route" in self.model_fields_set:
            raise ValueError("['paper_route'] is not read with mode 'mean'")
        return self


def reward_form_for_critic(params: BaseModel) -> CriticRewardForm:
    """A strategy with a ``mode`` parameter (``RewardForm``) under a critic: a paper form
    gives token rewards, a mean form mean-preserving weights."""
    return "token_rewards" if getattr(params, "mode", "mean") == "paper" else "weights"


@builtin
class ABCStrategy(CreditStrategy):
    """Attention-based credit with alpha the direction model's attention over the response
    (sum 1 over valid tokens). ``mean``: w_t = (1 - beta) + beta n alpha_t; a row without
    attention mass on its response, or with one token, gets w = 1. ``paper``: the token
    reward r_t = beta R alpha_t + (1 - beta) R 1[t = T] (R the response reward, T its last
    valid token; a row without attention mass spreads beta R evenly, counted), turned into
    advantages within the group."""

    name = "abc"
    requires = frozenset({"reward_attention"})
    Params: ClassVar[type[BaseModel]] = ABCParams
    params: ABCParams

    @property
    def reads_groups(self) -> bool:
        return self.params.mode == "paper"

    @classmethod
    def critic_form(cls, params: BaseModel) -> CriticRewardForm | None:
        return reward_form_for_critic(params)

    def assign_with_diagnostics(self, batch: CreditBatch) -> CreditResult:
        batch.require(self.requires, self.name)
        alpha = batch.reward_attention
        assert alpha is not None  # guaranteed by batch.require
        mask = batch.mask
        check_finite_at("CreditBatch.reward_attention", alpha, mask, nonnegative=True)
        a = torch.where(mask, alpha.to(torch.float64), 0.0)
        n = mask.sum(dim=1).to(torch.float64)
        beta = self.params.beta
        if self.params.mode == "paper":
            rewards, _ = batch.require_groups(self.name)
            empty = a.sum(dim=1) <= 0
            a = torch.where(empty.unsqueeze(1) & mask, 1.0 / n.unsqueeze(1), a)
            R = rewards.to(torch.float64).unsqueeze(1)
            r = beta * R * a + (1.0 - beta) * R * last_valid(mask).to(torch.float64)
            return paper_result(batch, r, int(empty.sum()), self.params.paper_route)
        uniform = (a.sum(dim=1) <= 0) | (n == 1)
        w = (1.0 - beta) + beta * n.unsqueeze(1) * a
        w = torch.where(mask, torch.where(uniform.unsqueeze(1), 1.0, w), 0.0)
        return _result(batch, w, int(uniform.sum()))


class REDParams(TokenRewardParams):
    """``TokenRewardParams`` of RED's prefix-score differences."""


@builtin
class REDStrategy(CreditStrategy):
    """Reward redistribution with r_t = s_t - s_{t-1} the direction model's prefix-score
    differences. ``mean``, allocation ``aligned`` (this library's mean form): w_t
    proportional to max(sign(A) r_t, 0) + eps, rescaled to mean 1 over the response; a
    response whose r_t all oppose sign(A) gets (near) uniform weights from the floor; A = 0
    gives w = 1. ``mean``, allocation ``softmax_floor``: DATC's allocation of sign(A) r_t.
    ``paper``: r_t is the token reward, turned into advantages within the group. r_t sums
    to the direction model's R - s_0: no form reads the task's reward where a separate
    scorer sets it."""

    name = "red"
    requires = frozenset({"prefix_rewards"})
    Params: ClassVar[type[BaseModel]] = REDParams
    params: REDParams

    @property
    def reads_groups(self) -> bool:
        return self.params.mode == "paper"

    @classmethod
    def critic_form(cls, params: BaseModel) -> CriticRewardForm | None:
        return reward_form_for_critic(params)

    def assign_with_diagnostics(self, batch: CreditBatch) -> CreditResult:
        batch.require(self.requires, self.name)
        r = batch.prefix_rewards
        assert r is not None  # guaranteed by batch.require
        mask = batch.mask
        check_finite_at("CreditBatch.prefix_rewards", r, mask)
        return self.params.assign(batch, r, self.name)
