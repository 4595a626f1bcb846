"""The token rewards a TRL reward function gives (docs/trl.md, "Token rewards from a reward
function"; docs/design.md, "User-given token rewards (process supervision)").

TRL calls each reward function in ``GRPOTrainer._calculate_rewards`` with the batch's
``completion_ids`` (one list of token ids per completion of this process) and takes one
float (or None) per completion. Where the run's strategy reads token rewards (``credit:
process``), ``CreditGRPOTrainer`` puts a ``TokenRewardFunction`` in TRL's list in place of
each plain (synchronous, not a model) reward function: TRL calls it exactly as it calls the
function; it reads the function's items with ``credit_core.given_rewards.
parse_reward_outputs`` (a number; one reward per completion token; ``(start, end, reward)``
step spans; or ``{"outcome": R, "token_rewards" | "step_rewards": ...}``), positions
indexing ``completion_ids[i]``; gives TRL the outcome R (None stays None: TRL's "no reward");
and keeps the token rewards until the credit takes them (``take``). ``step_token_rewards``
joins the functions' token rewards for the credit on TRL's (B, T) completion tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from credit_core import CreditError, TokenRewards
from credit_core.given_rewards import STEP_KEY, TOKEN_KEY, parse_reward_outputs


def completion_mask(completion_ids: Sequence[Sequence[int]]) -> torch.Tensor:
    """(B, L) bool, right-padded: row i True at its first ``len(completion_ids[i])`` columns,
    L the longest completion (at least 1)."""
    lengths = torch.tensor([len(ids) for ids in completion_ids], dtype=torch.long)
    longest = max(1, int(lengths.max())) if len(completion_ids) else 1
    return torch.arange(longest).unsqueeze(0) < lengths.unsqueeze(1)


class TokenRewardFunction:
    """A TRL reward function ``func`` (named ``name`` in TRL's logs) that may return token
    rewards; TRL gets the outcomes, the credit the token rewards (module docstring).

    ``__call__`` takes TRL's keyword arguments and returns one float or None per completion;
    a bad item (a length that is not the completion's, a span outside it, a NaN) raises one
    ``CreditError`` naming the function and the completion (its index in this process's
    batch, the order of ``completion_ids``).
    """

    def __init__(self, func: Callable[..., Any], name: str) -> None:
        self.func = func
        self.__name__ = name
        self._given: TokenRewards | None = None

    def __call__(
        self, *, prompts: Any, completions: Any, completion_ids: Sequence[Sequence[int]], **kw: Any
    ) -> list[float | None]:
        self._given = None
        items = list(
            self.func(prompts=prompts, completions=completions, completion_ids=completion_ids, **kw)
        )
        mask = completion_mask(completion_ids)
        parsed = [0.0 if item is None else item for item in items]
        where = f"reward function {self.__name__!r}"
        rewards, self._given = parse_reward_outputs(parsed, mask, name=where)
        return [
            None if item is None else r for item, r in zip(items, rewards.tolist(), strict=True)
        ]

    def take(self) -> TokenRewards | None:
        """The token rewards (B, L) of the last call (None where every item was a number or
        None), once: a second take gives None."""
        given, self._given = self._given, None
        return given


def step_token_rewards(
    functions: Sequence[tuple[float, TokenRewardFunction]], mask: torch.Tensor
) -> TokenRewards:
    """The step's ``TokenRewards`` (B, T) on TRL's completion tensors from each function's
    (weight w_f, function) of its last call: r = sum_f w_f r_f where any function gives one
    (TRL's reward is the same weighted sum of the outcomes), kept only within the loss
    ``mask`` (B, T) bool (``completion_mask`` and ``tool_mask``: a reward given at a tool
    result's token, or in a completion TRL masks out as truncated, is not given).
    ``CreditError`` naming the functions when none returned token rewards."""
    B, T = mask.shape
    values = torch.zeros(B, T, dtype=torch.float64, device=mask.device)
    given = torch.zeros(B, T, dtype=torch.bool, device=mask.device)
    found = False
    for weight, func in functions:
        part = func.take()
        if part is None:
            continue
        found = True
        part = part.pad_to(T)
        values += weight * part.values.to(mask.device)
        given |= part.given.to(mask.device)
    if not found:
        names = [func.__name__ for _, func in functions]
        raise CreditError(
            f"credit: the strategy reads token rewards, but no reward function ({names}) "
            f"returned any for this batch: return a list of one reward per completion token, "
            f"(start, end, reward) step spans, or {{'outcome': R, {STEP_KEY!r}: [...]}} (or "
            f"{TOKEN_KEY!r}) per completion (docs/trl.md)"
        )
    given &= mask
    return TokenRewards(torch.where(given, values, 0.0), given)
