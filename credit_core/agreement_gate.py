"""How far to trust a direction model: its agreement with the reward, and the gate toward GRPO.

docs/design.md, "Trusting the direction model": the direction model's score of each response
and the reward the advantages were formed from give a within-group agreement, the mean over
groups of their Spearman rank correlation (groups whose reward is constant carry no ranking
and are skipped). ``AgreementGate`` keeps an exponential moving average of it and mixes a
strategy's token advantages toward GRPO's,

    a'_t = A + alpha (a_t - A),   alpha = clip((EMA - low) / (high - low), 0, 1),

i.e. w' = 1 + alpha (w - 1) on the token weights w = a / A. For a strategy that keeps the
per-response mean of A (every weight strategy), a' keeps it exactly; where a_t has the sign of
A (w >= 0), a'_t, a convex combination of A and a_t, has it too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
)

from credit_core.errors import CreditError
from credit_core.tensor_checks import check_tensor

#: The EMA's weight on its past when ``gate.decay`` is not given.
DEFAULT_DECAY = 0.9


@dataclass(frozen=True)
class Agreement:
    """One step's within-group agreement of a direction model with the reward.

    - ``value``: mean over the used groups of Spearman's rho (tie-averaged ranks) between the
      direction model's scores and the rewards; NaN when no group was used.
    - ``groups``: groups whose reward varies (the ones used).
    - ``skipped``: groups with constant reward.
    """

    value: float
    groups: int
    skipped: int


def _tied_ranks(values: torch.Tensor, member: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Ranks (1-based, ties averaged) of ``values`` (B,) within their groups: ``member`` (B,)
    each value's group in 0 .. n - 1, ``counts`` (n,) the group sizes. Compares within
    groups only, on a (n, G, G) block for the largest group size G, never (B, B)."""
    n, size = counts.numel(), int(counts.max())
    order = torch.argsort(member, stable=True)
    starts = torch.cumsum(counts, 0) - counts
    slot = member[order] * size + (
        torch.arange(values.numel(), device=values.device) - torch.repeat_interleave(starts, counts)
    )
    block = torch.full((n * size,), torch.nan, dtype=values.dtype, device=values.device)
    block[slot] = values[order]
    v = block.view(n, size)
    less = (v[:, None, :] < v[:, :, None]).sum(dim=2)  # NaN padding compares False
    equal = (v[:, None, :] == v[:, :, None]).sum(dim=2)
    ranks = less.to(torch.float64) + (equal.to(torch.float64) + 1.0) / 2.0
    out = torch.empty_like(values, dtype=torch.float64)
    out[order] = ranks.view(-1)[slot]
    return out


def direction_agreement(
    scores: torch.Tensor, rewards: torch.Tensor, groups: torch.Tensor
) -> Agreement:
    """Within-group Spearman agreement of ``scores`` (B,) with ``rewards`` (B,).

    ``groups`` (B,) integer: the prompt group of each response (any ids, any order). A group
    with constant reward is skipped; a group with varying reward but constant scores counts
    with rho 0 (the direction model ranks none of its responses). Computed in float64 from
    comparisons within each group (O(B G) for groups of at most G responses).
    """
    s = check_tensor("scores", scores, (None,), floating=True).detach()
    r = check_tensor("rewards", rewards, (s.shape[0],), floating=True, device=s.device).detach()
    g = check_tensor("groups", groups, (s.shape[0],), device=s.device)
    if g.is_floating_point() or g.dtype == torch.bool:
        raise CreditError(f"groups: expected an integer dtype, got {g.dtype}")
    for name, t in (("scores", s), ("rewards", r)):
        if not bool(torch.isfinite(t).all()):
            raise CreditError(f"{name}: expected finite values, got NaN or inf")
    ids, member, counts = torch.unique(g, return_inverse=True, return_counts=True)
    rs, rr = _tied_ranks(s.double(), member, counts), _tied_ranks(r.double(), member, counts)
    n_groups = ids.numel()

    def group_sum(x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(n_groups, dtype=torch.float64, device=s.device).index_add_(0, member, x)

    count = group_sum(torch.ones_like(rs))
    ds, dr = rs - (group_sum(rs) / count)[member], rr - (group_sum(rr) / count)[member]
    cov, var_s, var_r = group_sum(ds * dr), group_sum(ds * ds), group_sum(dr * dr)
    used = var_r > 0
    rho = torch.where(var_s > 0, cov / (var_s * var_r).clamp_min(1e-300).sqrt(), 0.0)
    n_used = int(used.sum())
    value = float(rho[used].mean()) if n_used else math.nan
    return Agreement(value=value, groups=n_used, skipped=n_groups - n_used)


@dataclass
class AgreementGate:
    """The agreement EMA of one run and the mix it sets (docs/design.md, "Trusting the
    direction model").

    ``low`` < ``high`` in [-1, 1]: alpha is 0 at or below ``low`` (GRPO), 1 at or above
    ``high`` (the strategy unchanged). ``decay`` in [0, 1): the EMA's weight on its past.
    ``ema`` is None until a step with a used group; alpha is 0 until then.
    """

    low: float
    high: float
    decay: float = DEFAULT_DECAY
    ema: float | None = None

    def __post_init__(self) -> None:
        if not -1.0 <= self.low < self.high <= 1.0:
            raise CreditError(
                f"gate.agreement: expected -1 <= low < high <= 1, got [{self.low}, {self.high}]"
            )
        if not 0.0 <= self.decay < 1.0:
            raise CreditError(f"gate.decay: expected a value in [0, 1), got {self.decay}")

    @property
    def alpha(self) -> float:
        """The current mix: clip((ema - low) / (high - low), 0, 1); 0 before any measure."""
        if self.ema is None:
            return 0.0
        return min(1.0, max(0.0, (self.ema - self.low) / (self.high - self.low)))

    def update(self, agreement: Agreement) -> float:
        """Fold one step's agreement into the EMA (a step with no used group leaves it as
        it is; the first measure starts it) and return the new alpha."""
        if agreement.groups:
            v = agreement.value
            self.ema = v if self.ema is None else self.decay * self.ema + (1 - self.decay) * v
        return self.alpha

    def state_dict(self) -> dict[str, Any]:
        """The EMA, the gate's only state (a checkpoint resumes it bit for bit)."""
        return {"ema": self.ema}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict()``'s EMA (a float, or None before any measure)."""
        ema = state.get("ema", "missing")
        if ema is not None and not isinstance(ema, float):
            raise CreditError(f"gate state: expected 'ema' a float or None, got {ema!r}")
        self.ema = ema


#: What the gate's agreement ranks against the reward: the direction model's ``score`` of each
#: response, or its ``attribution``, the sum over the response's tokens of the first-order
#: attribution (e_t - e_null) . g_t of the reward gradient g that the strategy reads.
GateMeasure = Literal["score", "attribution"]


class GateConfig(BaseModel):
    """The ``gate`` key of a credit setting: ``{agreement: [low, high], decay: 0.9,
    measure: score}`` (docs/design.md, "Trusting the direction model"); ``build()`` makes the
    run's gate. ``measure: score`` (the default) is left out of the dump, so a config without
    the key has the dump (and the run fingerprints) it had before the key existed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    agreement: tuple[float, float] = Field(
        description="[low, high]: alpha is 0 at or below low, 1 at or above high"
    )
    decay: float = Field(DEFAULT_DECAY, ge=0.0, lt=1.0, description="the EMA's weight on its past")
    measure: GateMeasure = Field(
        "score",
        description="what is ranked against the reward: the direction model's score of each "
        "response, or the summed attribution of its reward gradient (reads reward_attribution)",
    )

    @field_validator("agreement")
    @classmethod
    def _ordered(cls, value: tuple[float, float]) -> tuple[float, float]:
        low, high = value
        if not -1.0 <= low < high <= 1.0:
            raise ValueError(f"expected -1 <= low < high <= 1, got [{low}, {high}]")
        return value

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if self.measure == "score":
            data.pop("measure", None)
        return data

    @property
    def signals(self) -> frozenset[str]:
        """The signals the gate reads beside the strategy's: ``reward_attribution`` with
        ``measure: attribution``, none with ``measure: score`` (scores come with rewards)."""
        return frozenset({"reward_attribution"}) if self.measure == "attribution" else frozenset()

    def build(self) -> AgreementGate:
        """A fresh gate (no EMA yet) of this setting."""
        return AgreementGate(self.agreement[0], self.agreement[1], self.decay)


def gate_token_advantages(
    token_advantages: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, alpha: float
) -> torch.Tensor:
    """A + alpha (a - A) at valid tokens, 0 at padding: token advantages (B, T) mixed toward
    the response advantages ``advantages`` (B,) by ``alpha`` in [0, 1]. alpha = 1 returns
    ``token_advantages`` itself (bit for bit); alpha = 0 gives GRPO's A at every token."""
    a = check_tensor("token_advantages", token_advantages, (None, None), floating=True)
    A = check_tensor("advantages", advantages, (a.shape[0],), floating=True, device=a.device)
    m = check_tensor("mask", mask, tuple(a.shape), dtype=torch.bool, device=a.device)
    if not 0.0 <= alpha <= 1.0:
        raise CreditError(f"alpha: expected a value in [0, 1], got {alpha}")
    if alpha == 1.0:
        return a
    base = A.to(a.dtype)[:, None].expand_as(a)
    return torch.where(m, base + alpha * (a - base), torch.zeros_like(a))
