"""``position_decay``: more credit to the early tokens of a response.

Registered with credit_core through the entry point ``position_decay`` in the group
``credit_core.strategies`` (see pyproject.toml), which names this module.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

import torch
from pydantic import BaseModel, Field

from credit_core import CreditBatch, CreditStrategy, ScoreParams, ScoreStrategy, hookimpl


class PositionDecayParams(ScoreParams):
    """``ScoreParams`` (beta, lam, on_nonfinite) plus the decay's half-life in tokens."""

    half_life: float = Field(
        8.0, gt=0.0, allow_inf_nan=False, description="tokens over which the score halves"
    )


class PositionDecay(ScoreStrategy):
    """s_t = 2 ** (-k_t / half_life), k_t = index of t among the response's valid tokens.

    Needs no signal from the backend. Scores are scale-free after the allocation's RMS
    normalization, so ``half_life`` sets the shape of the decay, not its size.
    """

    name = "position_decay"
    requires = frozenset()
    Params: ClassVar[type[BaseModel]] = PositionDecayParams
    params: PositionDecayParams

    def scores(self, batch: CreditBatch) -> torch.Tensor:
        k = batch.mask.long().cumsum(dim=1) - 1
        return torch.exp2(-k.double() / self.params.half_life)


@hookimpl
def credit_core_strategies() -> Iterable[type[CreditStrategy]]:
    """The strategies of this plugin."""
    return [PositionDecay]
