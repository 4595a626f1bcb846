"""Statistics over seeds: mean with a Student-t 95% interval, and paired differences.

Student-t quantiles come from ``scipy.stats.t``.

- ``mean_interval(values)``: mean +- t_{(1+c)/2, n-1} * s / sqrt(n), s the sample standard
  deviation (n - 1 in the denominator). With n = 1 the interval is undefined (NaN bounds);
  with n = 0 everything is NaN.
- ``paired_difference(a, b)``: the same interval over the per-seed differences a[s] - b[s],
  on the seeds present in both.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scipy import stats

_NAN = float("nan")


@dataclass(frozen=True)
class Interval:
    """A mean over ``n`` values with the bounds of its confidence interval (NaN if n < 2)."""

    mean: float
    low: float
    high: float
    n: int

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def excludes_zero(self) -> int:
        """+1 if the whole interval is above 0, -1 if below, 0 if it contains 0 or is NaN."""
        if self.n < 2 or math.isnan(self.low):
            return 0
        if self.low > 0:
            return 1
        if self.high < 0:
            return -1
        return 0


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` > 0 degrees of freedom (0 < p < 1)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p: expected a probability in (0, 1), got {p}")
    if df <= 0:
        raise ValueError(f"df: expected > 0, got {df}")
    return float(stats.t.ppf(p, df))


def mean_interval(values: Iterable[float], confidence: float = 0.95) -> Interval:
    """Mean of ``values`` and its two-sided Student-t interval at ``confidence``.

    NaN values are an error (a run without the metric must be left out by the caller).
    """
    xs = [float(v) for v in values]
    if any(math.isnan(v) for v in xs):
        raise ValueError(f"values: expected finite numbers, got {xs}")
    n = len(xs)
    if n == 0:
        return Interval(_NAN, _NAN, _NAN, 0)
    mean = math.fsum(xs) / n
    if n == 1:
        return Interval(mean, _NAN, _NAN, 1)
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in xs) / (n - 1))
    half = t_quantile((1.0 + confidence) / 2.0, n - 1) * sd / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n)


def paired_difference(
    a: Mapping[int, float], b: Mapping[int, float], confidence: float = 0.95
) -> Interval:
    """Interval of the mean of a[s] - b[s] over the seeds ``s`` present in both mappings."""
    seeds = sorted(set(a) & set(b))
    return mean_interval((a[s] - b[s] for s in seeds), confidence)
