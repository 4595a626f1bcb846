"""The pre-registered primary family of a report: its contrasts, their verdicts, GRPO's row.

The config names the family before the runs (``report.primary_family``, held as
``summary.PrimaryFamily``; docs/design.md, "Evaluation"). In every setting where both sides
ran, each contrast is the paired difference d_i = a_i - b_i of the setting's primary
held-out metric at the last evaluation over the (family, seed) pairs i both ran: each label
of ``against_baseline`` minus GRPO's row, and each declared pair. GRPO's row is the
config's baseline, or, with ``baseline_best_of`` (GRPO at several learning rates), per
setting the candidate with the highest mean primary metric over all its runs there: picked
on the pairs it is then judged on, which flatters GRPO (a contender's "beats GRPO" is
conservative, its "worse than GRPO" is not).

The verdict of a contrast with at least ``min_pairs`` pairs is the exact paired sign-flip
test (``stats.sign_flip_p``), Holm-corrected over every such contrast of the whole report
at level 1 - confidence (``stats.decide``); the paired t-test's p, Holm-adjusted over the
same family, is given beside it, and the Student-t 95% interval unadjusted. Beside the last
evaluation: the paired difference of the area under the held-out curve (``summary.
efficiency``: trapezoid over the evaluations, divided by the step span), unadjusted, not in
the family. Per setting, whether GRPO's curve has flattened: the change of its primary
metric between its last two evaluations, mean and interval over its runs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ablations.head_to_head import run_figures_by_pair
from ablations.stats import Interval, decide, mean_interval, sign_flip_p
from ablations.summary import (
    PrimaryFamily,
    RunFigures,
    SummarySpec,
    contrasts,
    fmt,
    fmt_interval,
)

Pair = tuple[str, int]


@dataclass(frozen=True)
class PrimaryContrast:
    """``contender`` minus ``against`` on ``setting``: ``diff`` the paired difference of the
    primary metric (Student-t interval, ``diff.p`` the paired t-test's p), ``auc`` that of
    the AUC (unadjusted), ``p_sign_flip`` the exact sign-flip p, ``below`` / ``above`` how
    many of the ``diff.n`` paired differences are below / above 0 (the rest are ties: how
    one-sided the pairs are, which the mean and its interval do not show); with a verdict (at least
    ``min_pairs`` pairs) ``sign`` +1 / -1 / 0 at Holm-adjusted sign-flip p ``p_holm`` <
    alpha and ``p_t_holm`` the t-test's p Holm-adjusted over the same family; without one,
    ``sign`` None and both NaN. ``against_grpo``: ``against`` is GRPO's row."""

    setting: str
    contender: str
    against: str
    against_grpo: bool
    diff: Interval
    auc: Interval
    p_sign_flip: float
    below: int
    above: int
    sign: int | None = None
    p_holm: float = math.nan
    p_t_holm: float = math.nan


@dataclass(frozen=True)
class BaselinePick:
    """GRPO's row of ``setting``: ``label``, picked among ``means`` (candidate -> its mean
    primary metric over its runs there, in the declared order; one entry without a pick)."""

    setting: str
    label: str
    means: dict[str, float]


@dataclass(frozen=True)
class Flattening:
    """GRPO's row ``label`` on ``setting`` between its last two evaluations: the mean primary
    metric at each (``before``, ``after``), the steps (None where the runs differ) and the
    per-run change ``after - before`` (mean and interval over its runs)."""

    setting: str
    label: str
    steps: tuple[int, int] | None
    before: float
    after: float
    change: Interval


@dataclass(frozen=True)
class PrimaryResult:
    """A report's primary family: its declaration, GRPO's row per setting, every contrast
    (settings in config order, contrasts in declared order) and the flattening lines;
    ``size`` the number of contrasts decided together (those with a verdict)."""

    family: PrimaryFamily
    picks: list[BaselinePick]
    contrasts: list[PrimaryContrast]
    flattening: list[Flattening]
    size: int

    def grpo_rows(self) -> dict[str, str] | None:
        """setting -> GRPO's row there, where it is picked among ``baseline_best_of``; None
        where GRPO's row is the configured baseline."""
        if not self.family.baseline_best_of:
            return None
        return {p.setting: p.label for p in self.picks}


def _diffs(a: Mapping[Pair, float], b: Mapping[Pair, float]) -> list[float]:
    """a - b over the pairs both have a finite value for, in pair order."""
    common = sorted(k for k in set(a) & set(b) if not math.isnan(a[k] + b[k]))
    return [a[k] - b[k] for k in common]


def _pick(
    setting: str, candidates: Sequence[str], runs: Mapping[str, Mapping[Pair, float]]
) -> BaselinePick | None:
    means = {c: math.fsum(runs[c].values()) / len(runs[c]) for c in candidates if runs.get(c)}
    if not means:
        return None
    best = max(means, key=lambda c: means[c])  # first of equal means, in declared order
    return BaselinePick(setting, best, means)


def _flattening(
    setting: str, label: str, runs: Mapping[Pair, RunFigures], confidence: float
) -> Flattening | None:
    ends = [f.held_curve[-2:] for f in runs.values() if len(f.held_curve) >= 2]
    if not ends:
        return None
    steps = {(a[0], b[0]) for a, b in ends}
    return Flattening(
        setting,
        label,
        next(iter(steps)) if len(steps) == 1 else None,
        math.fsum(a[1] for a, _ in ends) / len(ends),
        math.fsum(b[1] for _, b in ends) / len(ends),
        mean_interval([b[1] - a[1] for a, b in ends], confidence),
    )


def primary_family(rows: Iterable[dict[str, Any]], spec: SummarySpec) -> PrimaryResult:
    """The primary family of ``spec`` (``spec.primary_family``, not None) over ``rows``
    (module docstring)."""
    family = spec.primary_family
    if family is None:
        raise ValueError("spec.primary_family: expected a declared family, got None")
    grpo = family.baseline_best_of or (spec.baseline,)
    labels = {*family.against_baseline, *(x for p in family.pairs for x in p), *grpo}
    figures = run_figures_by_pair(rows, spec, labels)
    picks, flattening, found = [], [], []
    for s in spec.settings:
        runs = {label: figures.get((s.name, label), {}) for label in labels}
        primary = {label: {k: f.primary for k, f in r.items()} for label, r in runs.items()}
        auc = {label: {k: f.efficiency.auc for k, f in r.items()} for label, r in runs.items()}
        pick = _pick(s.name, grpo, primary)
        declared = [(c, pick.label, True) for c in family.against_baseline] if pick else []
        declared += [(a, b, False) for a, b in family.pairs]
        if pick is not None:
            picks.append(pick)
            flat = _flattening(s.name, pick.label, runs[pick.label], spec.confidence)
            if flat is not None:
                flattening.append(flat)
        for contender, against, vs_grpo in declared:
            d = _diffs(primary[contender], primary[against])
            if not d:
                continue
            found.append(
                PrimaryContrast(
                    s.name,
                    contender,
                    against,
                    vs_grpo,
                    mean_interval(d, spec.confidence),
                    mean_interval(_diffs(auc[contender], auc[against]), spec.confidence),
                    sign_flip_p(d),
                    sum(x < 0 for x in d),
                    sum(x > 0 for x in d),
                )
            )
    alpha = 1.0 - spec.confidence
    by_sign_flip = decide(
        [dataclasses.replace(c.diff, p=c.p_sign_flip) for c in found], spec.min_pairs, alpha
    )
    by_t = decide([c.diff for c in found], spec.min_pairs, alpha)
    decided = [
        dataclasses.replace(c, sign=f.sign, p_holm=f.p_holm, p_t_holm=t.p_holm)
        for c, f, t in zip(found, by_sign_flip, by_t, strict=True)
    ]
    size = by_sign_flip[0].family if by_sign_flip else 0
    return PrimaryResult(family, picks, decided, flattening, size)


_VERDICT = {1: "**better**", -1: "**worse**", 0: "not different", None: "too few pairs"}


def _p(p: float) -> str:
    """A p-value to three significant digits (an exact sign-flip p can be 0.000488)."""
    return "n/a" if math.isnan(p) else f"{p:.3g}"


def _grpo_text(result: PrimaryResult, baseline: str) -> str:
    family = result.family
    if not family.baseline_best_of:
        return f"GRPO's row is `{baseline}` in every setting."
    candidates = ", ".join(f"`{c}`" for c in family.baseline_best_of)
    picks = "; ".join(
        f"{p.setting}: **`{p.label}`** ("
        + ", ".join(f"`{c}` {fmt(m)}" for c, m in p.means.items())
        + ")"
        for p in result.picks
    )
    return (
        f"GRPO's row is, in each setting, the best of {candidates} (GRPO at several learning "
        "rates) by the mean primary metric over all its (family, seed) pairs there: "
        f"{picks}. It is picked on the same pairs it is judged on, which flatters GRPO: a "
        '"better than GRPO" verdict is conservative, a "worse than GRPO" one is not.'
    )


def _flat_line(f: Flattening, title: str) -> str:
    steps = f"steps {f.steps[0]} → {f.steps[1]}" if f.steps else "their last two evaluations"
    head = (
        f"- {title}: `{f.label}` {fmt(f.before)} → {fmt(f.after)} ({steps}), change "
        f"{fmt_interval(f.change, signed=True)} (n={f.change.n})"
    )
    if f.change.n < 2:
        return f"{head}: one run, no interval."
    if f.change.excludes_zero() > 0:
        return f"{head}: **still rising** (the interval is above 0): the budget ends first."
    if f.change.excludes_zero() < 0:
        return f"{head}: falling (the interval is below 0)."
    return f"{head}: no rise detected (the interval contains 0)."


def primary_markdown(result: PrimaryResult, spec: SummarySpec) -> str:
    """The report's primary-family section: what the family is and how it is judged, GRPO's
    row, one table row per contrast, a tally per contrast across settings, and whether
    GRPO's curve has flattened in each setting."""
    family = result.family
    pct = f"{round(spec.confidence * 100)}%"
    alpha = 1.0 - spec.confidence
    titles = {s.name: s.title for s in spec.settings}
    declared = [f"`{c}` vs GRPO" for c in family.against_baseline]
    declared += [f"`{a}` vs `{b}`" for a, b in family.pairs]
    ns = sorted({c.diff.n for c in result.contrasts if c.sign is not None})
    floors = ", ".join(f"{2 / 2**n:.2g} at n = {n}" for n in ns)
    lines = [
        "## Primary family (pre-registered)",
        "",
        "Declared in the config before the runs (`report.primary_family`): in every setting "
        f"where both ran, {', '.join(declared)}. Each contrast is the paired difference of "
        "the setting's primary held-out metric at the last evaluation (contender minus the "
        "other, over the (family, seed) pairs both ran). Its verdict is the exact paired "
        "sign-flip test (two-sided, over all 2^n sign assignments of the n differences; no "
        f"normality assumed), Holm-corrected over the {contrasts(result.size)} of this "
        f"family with at least {spec.min_pairs} pairs, at {round(alpha * 100)}%; the paired "
        f"t-test's p, Holm-adjusted over the same family, is printed beside it. The {pct} "
        "intervals are Student-t and unadjusted (an interval can exclude 0 where the "
        "verdict finds no difference). The smallest p the sign-flip test can give is "
        f"2 / 2^n ({floors or 'no contrast has enough pairs'}); Holm's first threshold is "
        f"{fmt(alpha / max(result.size, 1), 4)}. *Δ AUC*: the paired difference of the "
        "area under the held-out curve (trapezoid over the evaluations, divided by the "
        "steps), unadjusted, not in the family. Every other contrast of this report is "
        "**secondary**: unadjusted intervals, no verdict.",
        "",
        _grpo_text(result, spec.baseline),
        "",
        "| setting | contrast | n | Δ primary [95% CI] | pairs below / above | sign-flip p | "
        "Holm-adjusted | verdict | t-test p, Holm-adjusted | Δ AUC [95% CI] |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in result.contrasts:
        against = f"GRPO (`{c.against}`)" if c.against_grpo else f"`{c.against}`"
        lines.append(
            f"| {titles[c.setting]} | `{c.contender}` − {against} | {c.diff.n} | "
            f"{fmt_interval(c.diff, signed=True)} | {c.below} / {c.above} | "
            f"{_p(c.p_sign_flip)} | {_p(c.p_holm)} | "
            f"{_VERDICT[c.sign]} | {_p(c.p_t_holm)} | {fmt_interval(c.auc, signed=True)} |"
        )
    lines.append("")
    by_contrast: dict[tuple[str, str], list[int | None]] = {}
    for c in result.contrasts:
        other = "GRPO" if c.against_grpo else f"`{c.against}`"
        by_contrast.setdefault((c.contender, other), []).append(c.sign)
    for (contender, other), signs in by_contrast.items():
        text = (
            f"- `{contender}` vs {other}: better in {signs.count(1)}, worse in "
            f"{signs.count(-1)}, not different in {signs.count(0)} of {len(signs)} setting"
            + ("" if len(signs) == 1 else "s")
        )
        if signs.count(None):
            text += f" ({signs.count(None)} with too few pairs for a verdict)"
        lines.append(text + ".")
    if result.flattening:
        lines += [
            "",
            "Has GRPO's curve flattened? The change of its primary metric between its last "
            f"two evaluations, mean [{pct} interval] over its runs:",
            "",
            *(_flat_line(f, titles[f.setting]) for f in result.flattening),
        ]
    return "\n".join(lines)
