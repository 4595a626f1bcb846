"""OAR-G: outcome-grounded advantage reshaping, gradient form (Li et al., 2026, "Outcome-Grounded
Advantage Reshaping for Fine-Grained Credit Assignment in Mathematical Reasoning", arXiv
2601.07408; docs/design.md, "Answer-gradient reweighting (OAR-G)").

A response is split by its answer span (``CreditBatch.answer_mask``, declared by the task):
its *reasoning tokens* are the valid tokens before the first answer token
(``reasoning_mask``). A backend computes the signal ``answer_saliency``

    s_t = |dJ/de_t . e_t|  at the reasoning tokens (0 elsewhere),

e_t the policy's input embedding of token t and J = KL(p0 || p_noisy) the shift of the
policy's own answer distribution (the softmax of its logits averaged over the positions that
predict the answer tokens) when Gaussian noise N(0, ``noise_std``^2) is added to the reasoning
tokens' embeddings; the gradient is taken at the perturbed point (at the clean point the KL
is at its minimum and its gradient is 0).

This module turns s into token advantages, per response, over its reasoning tokens R (n_R of
them), vectorised over the batch:

    u_t = log1p(s_t);  x_t = (u_t - min_R u) / (max_R u - min_R u)   (range 1 where all equal)
    tau = the ``quantile``-quantile of x over R (linear interpolation, numpy's default)
    w_t = max(x_t / tau, ``floor``)                    where x_t < tau  (noise suppression)
    w_t = 1 + ``beta`` (x_t - tau) / (1 - tau)         where x_t >= tau (signal boosting;
                                                        1 where tau = 1)
    w_t <- w_t n_R / sum_R w                           (sums to n_R over the reasoning tokens)

and w_t = 1 at every other valid token (the answer span and what follows it), so w > 0 and
w sums to the response's length over its valid tokens: A_t = A_i w_t keeps the sign of A_i
and its per-response mean. A response without a reasoning token or without an answer token
has no signal: w = 1 there, counted in ``uniform_fallbacks``.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field

from credit_core.allocation import weight_diagnostics
from credit_core.batch import CreditBatch
from credit_core.strategy import DEFAULT_ANSWER_NOISE_STD, CreditResult, CreditStrategy, builtin
from credit_core.tensor_checks import check_finite_at

#: The signal OAR-G reads; only a backend that can take the policy's own input gradient at a
#: task's answer span computes it (the native trainer, ``backends.torch``).
ANSWER_SALIENCY = "answer_saliency"


def reasoning_mask(mask: torch.Tensor, answer_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: the valid tokens of ``mask`` (B, T) before each row's first answer token
    of ``answer_mask`` (B, T) bool; all False on a row without an answer token."""
    T = mask.shape[1]
    positions = torch.arange(T, device=mask.device).expand_as(mask)
    first = torch.where(answer_mask, positions, T).min(dim=1).values
    has_answer = answer_mask.any(dim=1, keepdim=True)
    return mask & (positions < first.unsqueeze(1)) & has_answer


def row_quantile(values: torch.Tensor, mask: torch.Tensor, q: float) -> torch.Tensor:
    """(B,) float64: the q-quantile of each row's ``values`` (B, T) at the True positions of
    ``mask`` (B, T), linear interpolation between the order statistics at floor and ceil of
    q (n - 1) (``numpy.quantile``'s default); 0 on a row without a True position."""
    v = values.to(torch.float64)
    ordered = torch.sort(torch.where(mask, v, torch.inf), dim=1).values
    n = mask.sum(dim=1)
    pos = q * (n - 1).clamp_min(0).to(torch.float64)
    lo = pos.floor().long()
    hi = torch.minimum(lo + 1, (n - 1).clamp_min(0))
    low = ordered.gather(1, lo.unsqueeze(1)).squeeze(1)
    high = ordered.gather(1, hi.unsqueeze(1)).squeeze(1)
    tau = low + (high - low) * (pos - lo.to(torch.float64))
    return torch.where(n > 0, tau, 0.0)


def bilevel_weights(
    saliency: torch.Tensor, reasoning: torch.Tensor, *, quantile: float, beta: float, floor: float
) -> torch.Tensor:
    """The bi-level weights (B, T) float64 of the module docstring over the reasoning tokens
    ``reasoning`` (B, T) bool from ``saliency`` (B, T) >= 0, rescaled to sum to n_R per row;
    0 at every other position (the caller sets those)."""
    u = torch.log1p(torch.where(reasoning, saliency.to(torch.float64), 0.0))
    lo = torch.where(reasoning, u, torch.inf).min(dim=1, keepdim=True).values
    hi = torch.where(reasoning, u, -torch.inf).max(dim=1, keepdim=True).values
    spread = torch.where(hi > lo, hi - lo, 1.0)
    x = torch.where(reasoning, (u - torch.where(reasoning, lo, 0.0)) / spread, 0.0)
    tau = row_quantile(x, reasoning, quantile).unsqueeze(1)
    below = x < tau  # only where tau > 0, since x >= 0
    suppressed = torch.clamp_min(x / torch.where(below, tau, 1.0), floor)
    rise = torch.where(tau < 1.0, (x - tau) / torch.where(tau < 1.0, 1.0 - tau, 1.0), 0.0)
    w = torch.where(reasoning, torch.where(below, suppressed, 1.0 + beta * rise), 0.0)
    n_r = reasoning.sum(dim=1, keepdim=True).to(torch.float64)
    total = w.sum(dim=1, keepdim=True)  # >= 1 on a row with a reasoning token (its max is >= tau)
    return torch.where(reasoning, w * n_r / torch.where(total > 0, total, 1.0), 0.0)


class OARGParams(BaseModel):
    """OAR-G's parameters. ``noise_std`` is the authors' code default (1e-3); the paper and
    its code leave the threshold quantile and the boost to the command line, so
    ``quantile`` 0.5 and ``beta`` 1.0 are this library's choices; ``floor`` 0.1 is the
    authors' fixed floor of a suppressed weight."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    quantile: float = Field(
        0.5, ge=0.0, le=1.0, description="per-response quantile of the scores setting tau"
    )
    beta: float = Field(1.0, ge=0.0, allow_inf_nan=False, description="boost above tau")
    floor: float = Field(0.1, gt=0.0, le=1.0, description="least weight of a suppressed token")
    noise_std: float = Field(
        DEFAULT_ANSWER_NOISE_STD,
        gt=0.0,
        allow_inf_nan=False,
        description="std of the noise on the reasoning tokens' input embeddings",
    )


@builtin
class OARGStrategy(CreditStrategy):
    """OAR-G (module docstring; docs/design.md, "Answer-gradient reweighting (OAR-G)"):
    A_t = A_i w_t with the bi-level weights of ``answer_saliency`` over each response's
    reasoning tokens, w = 1 on its answer span and after it. Reads the signal and the
    task's answer span; a backend computes the signal with one extra no-grad forward and one
    forward + backward of the policy to its input embeddings."""

    name = "oar_g"
    requires = frozenset({ANSWER_SALIENCY})
    reads_answer_span = True
    Params: ClassVar[type[BaseModel]] = OARGParams
    params: OARGParams

    @property
    def answer_noise_std(self) -> float:
        return self.params.noise_std

    def assign_with_diagnostics(self, batch: CreditBatch) -> CreditResult:
        batch.require(self.requires, self.name)
        answer = batch.require_answer_span(self.name)
        s = batch.answer_saliency
        assert s is not None  # guaranteed by batch.require
        mask = batch.mask
        reasoning = reasoning_mask(mask, answer)
        check_finite_at(f"CreditBatch.{ANSWER_SALIENCY}", s, reasoning, nonnegative=True)
        p = self.params
        w = bilevel_weights(s, reasoning, quantile=p.quantile, beta=p.beta, floor=p.floor)
        w = torch.where(reasoning, w, torch.where(mask, 1.0, 0.0))
        no_signal = int((~reasoning.any(dim=1)).sum())
        adv = batch.advantages.to(torch.float64).unsqueeze(1) * w
        return CreditResult(adv.to(torch.float32), weight_diagnostics(w, mask, 0, no_signal))
