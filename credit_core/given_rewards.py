"""Token rewards the user gives: per-token or per-step rewards from a reward function
(docs/design.md, "User-given token rewards (process supervision)").

``TokenRewards`` is the signal a backend passes (``CreditSignals.token_rewards``): the values
(B, T) and where a reward is given (B, T). Per-token rewards give one at every valid token
(``from_dense``); per-step rewards are spans of response-token positions, each reward placed
at its span's last token (``from_spans``). ``parse_reward_outputs`` reads what a reward
function returned for a batch, one item per response: a number (the outcome only), a list of
numbers (per-token), a list of ``(start, end, reward)`` spans (per-step), or a mapping with
``outcome`` and ``token_rewards`` or ``step_rewards``. Every bad item is one ``CreditError``
naming the response (its index in the batch given) and the field.

Positions are response-token positions: 0 .. n_i - 1 over the ``True`` entries of a row of
the response mask, in order (the row's valid tokens; for a right-padded mask, the columns).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from numbers import Real

import torch

from credit_core.errors import CreditError
from credit_core.tensor_checks import check_tensor

#: One step reward: the response-token positions [start, end) and its reward.
Span = tuple[int, int, float]
#: The keys of a mapping item of ``parse_reward_outputs``.
OUTCOME_KEY = "outcome"
TOKEN_KEY = "token_rewards"
STEP_KEY = "step_rewards"


@dataclass(frozen=True)
class TokenRewards:
    """Rewards given at some response tokens of a batch of B responses of length T.

    - ``values`` (B, T) float64: the reward r_t where ``given``, exactly 0 elsewhere.
    - ``given`` (B, T) bool: where a reward is given (a subset of the valid tokens; a row
      may have none).

    Construction checks shapes, dtypes, device, that the given values are finite and that
    the others are 0; ``CreditError`` naming the field and the rows.
    """

    values: torch.Tensor
    given: torch.Tensor

    def __post_init__(self) -> None:
        v = check_tensor("TokenRewards.values", self.values, (None, None), dtype=torch.float64)
        check_tensor(
            "TokenRewards.given", self.given, tuple(v.shape), dtype=torch.bool, device=v.device
        )
        bad = torch.where(self.given, ~torch.isfinite(v), v != 0)
        if bool(bad.any()):
            rows = torch.nonzero(bad.any(dim=1)).flatten().tolist()
            raise CreditError(
                "TokenRewards.values: expected finite values where given and 0 elsewhere, "
                f"rows {rows} are not"
            )

    @classmethod
    def from_dense(
        cls, rows: Sequence[Sequence[float] | torch.Tensor], mask: torch.Tensor
    ) -> TokenRewards:
        """Per-token rewards: ``rows[i]`` holds one reward per valid token of row i of
        ``mask`` (B, T) bool (its length n_i = ``mask[i].sum()``); every valid token is
        given. ``CreditError`` naming response i for a wrong length or a non-finite value."""
        pairs = [
            _dense_pairs(f"response {i}: {TOKEN_KEY}", row, _length(mask, i))
            for i, row in _rows(rows, mask)
        ]
        return cls._build(mask, pairs)

    @classmethod
    def from_spans(cls, rows: Sequence[Sequence[Span]], mask: torch.Tensor) -> TokenRewards:
        """Per-step rewards: ``rows[i]`` is a list of ``(start, end, reward)`` spans of row
        i's response-token positions (``end`` exclusive), each reward given at its span's
        last token ``end - 1``. Spans lie in [0, n_i), are non-empty and do not overlap
        (any order; they need not cover the response). ``CreditError`` naming response i."""
        pairs = [
            _span_pairs(f"response {i}: {STEP_KEY}", row, _length(mask, i))
            for i, row in _rows(rows, mask)
        ]
        return cls._build(mask, pairs)

    @classmethod
    def _build(cls, mask: torch.Tensor, rows: list[list[tuple[int, float]]]) -> TokenRewards:
        """From (position, reward) pairs per row, positions among the row's valid tokens."""
        values = torch.zeros(mask.shape, dtype=torch.float64)
        given = torch.zeros(mask.shape, dtype=torch.bool)
        cpu = mask.cpu()
        for i, pairs in enumerate(rows):
            if not pairs:
                continue
            cols = torch.nonzero(cpu[i]).flatten()
            at = cols[torch.tensor([p for p, _ in pairs], dtype=torch.long)]
            values[i, at] = torch.tensor([r for _, r in pairs], dtype=torch.float64)
            given[i, at] = True
        return cls(values.to(mask.device), given.to(mask.device))

    @property
    def shape(self) -> tuple[int, int]:
        """(B, T)."""
        B, T = self.values.shape
        return int(B), int(T)

    def select(self, rows: torch.Tensor | slice) -> TokenRewards:
        """The token rewards of a subset of responses (rows of the batch dimension)."""
        return TokenRewards(self.values[rows], self.given[rows])

    def pad_to(self, length: int) -> TokenRewards:
        """The token rewards with ungiven positions appended along T up to ``length`` (>= T)."""
        T = self.shape[1]
        if length < T:
            raise CreditError(f"TokenRewards.pad_to: expected a length >= T={T}, got {length}")
        pad = length - T
        values = torch.nn.functional.pad(self.values, (0, pad))
        return TokenRewards(values, torch.nn.functional.pad(self.given, (0, pad)))

    @staticmethod
    def cat(parts: Sequence[TokenRewards]) -> TokenRewards:
        """Concatenate along the batch dimension (parts of one length T)."""
        if not parts:
            raise CreditError("TokenRewards.cat: expected at least one TokenRewards, got none")
        return TokenRewards(
            torch.cat([p.values for p in parts]), torch.cat([p.given for p in parts])
        )


def parse_reward_outputs(
    outputs: Sequence[object], mask: torch.Tensor, *, name: str = "reward function"
) -> tuple[torch.Tensor, TokenRewards | None]:
    """The rewards (B,) float32 and the ``TokenRewards`` (None where no item gives token
    rewards) of a reward function's ``outputs`` for B responses, one item per row of the
    response ``mask`` (B, T) bool:

    - a number R: the outcome R, no token reward;
    - a sequence of n_i numbers (list, tuple, 1-D tensor): per-token rewards; R = their sum;
    - a sequence of ``(start, end, reward)`` spans: per-step rewards (``from_spans``); R =
      their sum (an empty sequence: no reward given, R = 0);
    - a mapping ``{"outcome": R, "token_rewards": [...]}`` or ``{"outcome": R,
      "step_rewards": [...]}``: both (``outcome`` required with either).

    R must be finite. ``CreditError`` naming ``name``, the response index and the field.
    """
    B = int(check_tensor("mask", mask, (None, None), dtype=torch.bool).shape[0])
    if len(outputs) != B:
        raise CreditError(f"{name}: expected {B} rewards (one per response), got {len(outputs)}")
    rewards: list[float] = []
    pairs: list[list[tuple[int, float]]] = []
    for i, item in enumerate(outputs):
        where = f"{name}: response {i}"
        outcome, row = _parse_item(where, item, _length(mask, i))
        rewards.append(outcome)
        pairs.append(row)
    token = None if all(_is_number(item) for item in outputs) else TokenRewards._build(mask, pairs)
    return torch.tensor(rewards, dtype=torch.float32, device=mask.device), token


def _parse_item(where: str, item: object, n: int) -> tuple[float, list[tuple[int, float]]]:
    """(outcome R, (position, reward) pairs) of one response's reward-function output."""
    if _is_number(item):
        return _finite(f"{where}: reward", item), []
    if isinstance(item, Mapping):
        keys = set(item)
        given = keys & {TOKEN_KEY, STEP_KEY}
        unknown = sorted(str(k) for k in keys - {OUTCOME_KEY, TOKEN_KEY, STEP_KEY})
        if unknown or OUTCOME_KEY not in keys or len(given) != 1:
            raise CreditError(
                f"{where}: expected a mapping with {OUTCOME_KEY!r} and one of {TOKEN_KEY!r} "
                f"or {STEP_KEY!r}, got keys {sorted(str(k) for k in keys)}"
            )
        outcome = _finite(f"{where}: {OUTCOME_KEY}", item[OUTCOME_KEY])
        key = given.pop()
        parse = _dense_pairs if key == TOKEN_KEY else _span_pairs
        return outcome, parse(f"{where}: {key}", item[key], n)
    seq = _sequence(where, item)
    if seq and not _is_number(seq[0]):
        row = _span_pairs(f"{where}: {STEP_KEY}", seq, n)
    elif seq:
        row = _dense_pairs(f"{where}: {TOKEN_KEY}", seq, n)
    else:
        row = []
    return math.fsum(r for _, r in row), row


def _dense_pairs(where: str, row: object, n: int) -> list[tuple[int, float]]:
    """One reward per valid token: (k, r_k) for k < n; ``CreditError`` naming ``where``."""
    seq = _sequence(where, row)
    if len(seq) != n:
        raise CreditError(f"{where}: expected one reward per response token ({n}), got {len(seq)}")
    return [(k, _finite(f"{where}[{k}]", r)) for k, r in enumerate(seq)]


def _span_pairs(where: str, row: object, n: int) -> list[tuple[int, float]]:
    """(end - 1, reward) per span; spans in [0, n), non-empty, not overlapping."""
    spans = []
    for k, span in enumerate(_sequence(where, row)):
        if not (isinstance(span, Sequence) and len(span) == 3):
            raise CreditError(f"{where}[{k}]: expected (start, end, reward), got {span!r}")
        start, end, reward = span
        if not (_is_int(start) and _is_int(end) and 0 <= start < end <= n):
            raise CreditError(
                f"{where}[{k}]: expected integer positions 0 <= start < end <= {n} (the "
                f"response's tokens, end exclusive), got ({start!r}, {end!r})"
            )
        spans.append((int(start), int(end), _finite(f"{where}[{k}]: reward", reward), k))
    spans.sort()
    for (_, end, _, a), (start, _, _, b) in itertools.pairwise(spans):
        if start < end:
            raise CreditError(f"{where}: spans {a} and {b} overlap")
    return [(end - 1, reward) for _, end, reward, _ in spans]


def _rows(rows: Sequence[object], mask: torch.Tensor) -> list[tuple[int, object]]:
    """``enumerate(rows)`` after checking the mask and that there is one row per response."""
    check_tensor("mask", mask, (None, None), dtype=torch.bool)
    if len(rows) != mask.shape[0]:
        raise CreditError(f"rows: expected {mask.shape[0]} (one per response), got {len(rows)}")
    return list(enumerate(rows))


def _length(mask: torch.Tensor, i: int) -> int:
    return int(mask[i].sum())


def _sequence(where: str, value: object) -> list[object]:
    """``value`` as a list: a 1-D tensor, or a list or tuple; ``CreditError`` otherwise."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 1:
            raise CreditError(f"{where}: expected a 1-D tensor, got shape {tuple(value.shape)}")
        return [float(x) for x in value.tolist()]
    if isinstance(value, list | tuple):
        return list(value)
    raise CreditError(f"{where}: expected a list, got {type(value).__name__}")


def _is_number(value: object) -> bool:
    return isinstance(value, Real) or (isinstance(value, torch.Tensor) and value.dim() == 0)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _finite(where: str, value: object) -> float:
    if not _is_number(value):
        raise CreditError(f"{where}: expected a number, got {type(value).__name__}")
    x = float(value)  # type: ignore[arg-type]
    if not math.isfinite(x):
        raise CreditError(f"{where}: expected a finite number, got {x}")
    return x
