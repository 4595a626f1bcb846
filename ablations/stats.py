"""Statistics over seeds: mean with a Student-t 95% interval, and paired differences.

Hand-rolled (no SciPy): ``t_quantile`` inverts the Student-t CDF, computed through the
regularized incomplete beta function (continued fraction, modified Lentz), by bisection.

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


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        for num in (
            m * (b - m) * x / ((qam + m2) * (a + m2)),
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            return h
    raise ArithmeticError(f"incomplete beta did not converge for a={a}, b={b}, x={x}")


def regularized_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b) for a, b > 0 and x in [0, 1]."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x: expected a value in [0, 1], got {x}")
    if x in (0.0, 1.0):
        return x
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` > 0 degrees of freedom."""
    if df <= 0:
        raise ValueError(f"df: expected > 0, got {df}")
    tail = 0.5 * regularized_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (0 < p < 1)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p: expected a probability in (0, 1), got {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    if p == 0.5:
        return 0.0
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2.0


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
