"""Statistics over seeds: mean with a Student-t 95% interval, paired differences, the exact
paired sign-flip test, and the Holm correction of a family of tests.

Student-t quantiles and tail probabilities come from ``scipy.stats.t``.

- ``mean_interval(values)``: mean +- t_{(1+c)/2, n-1} * s / sqrt(n), s the sample standard
  deviation (n - 1 in the denominator), and the two-sided p-value of the one-sample t-test
  of mean 0, p = 2 P(T_{n-1} >= |mean| / (s / sqrt(n))) (so p < 1 - c exactly when the
  interval excludes 0). With n = 1 the interval and p are undefined (NaN); with n = 0
  everything is NaN. With s = 0 (n >= 2) p is 0 for a nonzero mean and 1 for mean 0.
- ``paired_difference(a, b)``: the same over the per-seed differences a[s] - b[s], on the
  seeds present in both: its p is the paired t-test's.
- ``sign_flip_p(diffs)``: the two-sided p of the paired sign-flip (permutation) test of
  mean 0 over all 2^n sign assignments, exact up to ``SIGN_FLIP_EXACT_MAX`` pairs.
- ``holm(p_values)``: Holm's step-down adjusted p-values (docs/design.md, "Evaluation").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

_NAN = float("nan")
#: Pairs up to which ``sign_flip_p`` counts every one of the 2^n sign assignments (by meet
#: in the middle: 2^(n/2) partial sums per half); above it, ``SIGN_FLIP_DRAWS`` random ones.
SIGN_FLIP_EXACT_MAX = 40
#: Random sign assignments of the Monte Carlo sign-flip test (more than 40 pairs).
SIGN_FLIP_DRAWS = 1 << 20


@dataclass(frozen=True)
class Interval:
    """A mean over ``n`` values with the bounds of its confidence interval (NaN if n < 2)."""

    mean: float
    low: float
    high: float
    n: int
    p: float = _NAN

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
    se = sd / math.sqrt(n)
    half = t_quantile((1.0 + confidence) / 2.0, n - 1) * se
    p = float(2.0 * stats.t.sf(abs(mean) / se, n - 1)) if se > 0 else float(mean == 0)
    return Interval(mean, mean - half, mean + half, n, p)


def paired_difference(
    a: Mapping[int, float], b: Mapping[int, float], confidence: float = 0.95
) -> Interval:
    """Interval of the mean of a[s] - b[s] over the seeds ``s`` present in both mappings."""
    seeds = sorted(set(a) & set(b))
    return mean_interval((a[s] - b[s] for s in seeds), confidence)


def _signed_sums(values: np.ndarray) -> np.ndarray:
    """sum_i s_i v_i for every s in {-1, +1}^len(values) (2^len values)."""
    sums = np.zeros(1)
    for v in values:
        sums = np.concatenate([sums + v, sums - v])
    return sums


def sign_flip_p(
    diffs: Sequence[float], exact_max: int = SIGN_FLIP_EXACT_MAX, seed: int = 0
) -> float:
    """Two-sided p of the paired sign-flip test that the differences ``diffs`` (d_1..d_n,
    finite) are symmetric about 0: the share of the 2^n sign assignments s whose
    |sum_i s_i d_i| >= |sum_i d_i| (docs/design.md, "Evaluation"). Exact (every assignment
    counted) for n <= ``exact_max``; above it the Monte Carlo estimate (1 + hits) / (1 +
    ``SIGN_FLIP_DRAWS``) over random assignments drawn with ``seed``. The observed
    assignment and its mirror always count, so p >= 2 / 2^n unless every d_i is 0 (then
    p = 1); no normality is assumed. Sums equal up to rounding (relative 1e-9 of sum |d_i|)
    count as ties. NaN for n = 0; ValueError on a NaN or infinite difference."""
    d = np.asarray([float(x) for x in diffs], dtype=np.float64)
    if not np.all(np.isfinite(d)):
        raise ValueError(f"diffs: expected finite numbers, got {d.tolist()}")
    n = d.size
    if n == 0:
        return _NAN
    scale = float(np.abs(d).sum())
    bar = abs(float(d.sum())) - 1e-9 * scale  # |S| >= bar counts
    if bar <= 0:
        return 1.0
    if n > exact_max:
        gen = np.random.default_rng(seed)
        hits = 0
        for start in range(0, SIGN_FLIP_DRAWS, 1 << 14):
            size = min(1 << 14, SIGN_FLIP_DRAWS - start)
            signs = gen.integers(0, 2, size=(size, n)) * 2 - 1
            hits += int(np.count_nonzero(np.abs(signs @ d) >= bar))
        return (1 + hits) / (1 + SIGN_FLIP_DRAWS)
    left = _signed_sums(d[: n // 2])
    right = np.sort(_signed_sums(d[n // 2 :]))
    # for each left sum l: the right sums r with l + r >= bar or l + r <= -bar (disjoint)
    above = right.size - np.searchsorted(right, bar - left, side="left")
    below = np.searchsorted(right, -bar - left, side="right")
    return float(np.sum(above + below)) / float(left.size * right.size)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's adjusted p-values of a family of m tests, in the order given.

    With the p-values sorted p_(1) <= ... <= p_(m): adj_(i) = max_{j <= i} min(1,
    (m - j + 1) p_(j)). Rejecting where adj < alpha controls the family-wise error rate at
    alpha under any dependence between the tests. NaN p-values are an error (a test without
    a p-value is left out of the family by the caller)."""
    ps = [float(p) for p in p_values]
    if any(math.isnan(p) or not 0.0 <= p <= 1.0 for p in ps):
        raise ValueError(f"p_values: expected probabilities in [0, 1], got {ps}")
    m = len(ps)
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda k: ps[k])):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        adjusted[i] = running
    return adjusted


@dataclass(frozen=True)
class Decision:
    """The verdict on one contrast of a family: ``sign`` +1 / -1 (the mean difference is
    above / below 0 at Holm-adjusted p < alpha), 0 (not distinguishable), or None (fewer
    than ``min_pairs`` pairs: no verdict, and not part of the family); ``p_holm`` its
    adjusted p (NaN without a verdict); ``family`` the number of contrasts decided together."""

    sign: int | None
    p_holm: float
    family: int


def decide(diffs: Sequence[Interval], min_pairs: int, alpha: float) -> list[Decision]:
    """Decide the paired differences ``diffs`` of one family together: those over at least
    ``min_pairs`` (>= 2) pairs by their paired t-test's p (``Interval.p``), Holm-corrected
    over them (``holm``); the others get no verdict. In the order given."""
    if min_pairs < 2:
        raise ValueError(f"min_pairs: expected >= 2 (a t-test needs two pairs), got {min_pairs}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha: expected a level in (0, 1), got {alpha}")
    members = [i for i, d in enumerate(diffs) if d.n >= min_pairs]
    adjusted = dict(zip(members, holm([diffs[i].p for i in members]), strict=True))
    out = []
    for i, d in enumerate(diffs):
        if i not in adjusted:
            out.append(Decision(None, _NAN, len(members)))
            continue
        sign = (1 if d.mean > 0 else -1) if adjusted[i] < alpha else 0
        out.append(Decision(sign, adjusted[i], len(members)))
    return out
