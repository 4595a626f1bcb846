"""Paired, interleaved timing on top of ``torch.utils.benchmark``.

Functions compared with each other are timed in alternation (A, B, C, then B, C, A, ...:
the order rotates every round), one call per measurement, after warm-up calls. A slow phase
of a shared machine then hits every function alike, and the ratio of two functions' medians
(or the median of their per-round ratios) stays meaningful where absolute times drift.

Each call is timed alone with ``torch.utils.benchmark``'s clock, which synchronizes the
accelerator before each reading; statistics are medians and quartiles over the repeats.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from torch.utils.benchmark.utils.timer import timer as synchronized_clock


@dataclass(frozen=True)
class Summary:
    """Seconds per call over the repeats: median, min, quartiles, count."""

    median: float
    min: float
    q25: float
    q75: float
    n: int

    @classmethod
    def of(cls, times: list[float]) -> Summary:
        if not times:
            raise ValueError("Summary.of: expected at least one time, got none")
        return cls(
            median=statistics.median(times),
            min=min(times),
            q25=_quantile(times, 0.25),
            q75=_quantile(times, 0.75),
            n=len(times),
        )

    def to_dict(self) -> dict[str, float]:
        return {
            "median": self.median,
            "min": self.min,
            "q25": self.q25,
            "q75": self.q75,
            "n": self.n,
        }


@dataclass(frozen=True)
class Ratio:
    """``a / b`` for two interleaved series: ratio of medians and the quartiles of the
    per-round ratios (round i compares calls made next to each other in time)."""

    of_medians: float
    paired_median: float
    paired_q25: float
    paired_q75: float

    def to_dict(self) -> dict[str, float]:
        return {
            "of_medians": self.of_medians,
            "paired_median": self.paired_median,
            "paired_q25": self.paired_q25,
            "paired_q75": self.paired_q75,
        }

    def __str__(self) -> str:
        return f"{self.of_medians:.2f} [{self.paired_q25:.2f}, {self.paired_q75:.2f}]"


def _quantile(values: list[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default) without numpy."""
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def ratio(a: list[float], b: list[float]) -> Ratio:
    """Compare two series timed in the same rounds (same length, paired by index)."""
    if len(a) != len(b) or not a:
        raise ValueError(
            f"ratio: expected two equally long, non-empty series, got {len(a)}, {len(b)}"
        )
    paired = [x / y for x, y in zip(a, b, strict=True)]
    return Ratio(
        of_medians=statistics.median(a) / statistics.median(b),
        paired_median=statistics.median(paired),
        paired_q25=_quantile(paired, 0.25),
        paired_q75=_quantile(paired, 0.75),
    )


def time_once(fn: Callable[[], object]) -> float:
    """Seconds for exactly one call of ``fn``, read from ``torch.utils.benchmark``'s clock
    (which synchronizes the accelerator, if any, before each reading).

    ``benchmark.Timer.timeit`` is not used: it adds two untimed warm-up calls to every
    measurement, which triples the cost of seconds-long calls and breaks the alternation.
    """
    start = synchronized_clock()
    fn()
    return synchronized_clock() - start


def interleaved(
    fns: Mapping[str, Callable[[], object]],
    *,
    repeats: int,
    warmup: int = 1,
    warmup_fns: Mapping[str, Callable[[], object]] | None = None,
) -> dict[str, list[float]]:
    """Time every function ``repeats`` times, alternating between them (rotating order).

    Returns seconds per call, by name, in round order (index i of two series belongs to the
    same round). First come ``warmup`` untimed calls of each function, or of its stand-in
    in ``warmup_fns`` (a small call that loads the same kernels and libraries, for
    functions too slow to run one extra time).
    """
    if repeats < 1:
        raise ValueError(f"repeats: expected >= 1, got {repeats}")
    names = list(fns)
    warm = {**fns, **(warmup_fns or {})}
    for _ in range(warmup):
        for name in names:
            warm[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            times[name].append(time_once(fns[name]))
    return times
