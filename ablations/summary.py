"""From results.csv rows to per-run figures and per-strategy statistics over seeds.

Per run (one setting, family, strategy, seed):

- final train reward: mean of ``reward_mean`` over the last ``final_window`` training steps;
- held-out metrics at the last step that has them (``eval_reward_sampled``,
  ``eval_reward_greedy``, and the setting's ``primary`` metric, e.g. an exact task score);
- steps to threshold: the first training step at which the trailing moving average (window
  ``smooth``, full windows only) of ``reward_mean`` reaches the threshold, or None;
- seconds per step (and its rollout / signals / update split): mean over training steps,
  leaving out step 1 (warm-up) when there is more than one step; peak RSS; wall time;
- sample efficiency of the primary held-out metric over its evaluations (``efficiency``):
  the normalized area under the curve (its trapezoid mean over steps 0..last) and its
  value at 25% and 50% of the step budget (linear interpolation between evaluations); NaN
  when the metric was measured at fewer than two steps (older results);
- the credit probes (``probe_*`` columns, ``ablations.credit_probes``) at the first and the
  last evaluation that has them; NaN for older results without them.

Per strategy, over seeds: mean and Student-t interval of each metric, and the paired
difference to the baseline strategy on the same seeds. The automatic threshold of a
(setting, family) is the step-1 train reward (mean over all runs) plus half the gap to the
best strategy's mean final train reward: the same bar for every strategy.

A verdict (beats / worse / not distinguishable) is given only with at least ``min_pairs``
(family, seed) pairs; with fewer, the report shows the numbers and says "too few pairs". It
is the paired t-test of the differences, Holm-corrected over the setting's contrasts
(``stats.decide``): ``summarize`` decides the method-vs-baseline and method-vs-control
contrasts together; ``contrasts.judge`` decides them again with every other contrast of the
setting (the head-to-head ones) in the family. Where the config declares a primary family
(``SummarySpec.primary_family``; ``ablations.primary``), the verdicts are that family's and
every contrast here is secondary: its unadjusted interval only, no verdict.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ablations.results import RunKey
from ablations.stats import Decision, Interval, decide, mean_interval, paired_difference

#: The fewest (family, seed) pairs a verdict is given from: a two-pair interval has one
#: degree of freedom, and the quick run's n = 2 "worse" on MiniLM was absent at n = 8.
MIN_PAIRS = 6


@dataclass(frozen=True)
class SettingSpec:
    """How one setting is summarized: its title, primary held-out metric (a results.csv
    column), a human name for that metric, and a fixed threshold (None = automatic)."""

    name: str
    title: str
    primary: str
    metric_label: str
    threshold: float | None = None


@dataclass(frozen=True)
class PrimaryFamily:
    """A report's pre-registered primary family (docs/design.md, "Evaluation"): in every
    setting where they ran, each label of ``against_baseline`` minus GRPO's row, and each
    (contender, against) of ``pairs``, contender minus against. GRPO's row is, per setting,
    the label of ``baseline_best_of`` with the highest mean primary metric over its runs
    there (empty: ``SummarySpec.baseline``)."""

    against_baseline: tuple[str, ...]
    pairs: tuple[tuple[str, str], ...] = ()
    baseline_best_of: tuple[str, ...] = ()


@dataclass(frozen=True)
class SummarySpec:
    """How a report summarizes its runs; ``primary_family`` None: every verdict is the
    setting's Holm-corrected t-test (module docstring), else the family's and the rest is
    secondary."""

    settings: Sequence[SettingSpec]
    strategies: Sequence[str]
    baseline: str
    method: str
    control: str | None
    final_window: int = 5
    smooth: int = 5
    confidence: float = 0.95
    min_pairs: int = MIN_PAIRS
    primary_family: PrimaryFamily | None = None


@dataclass(frozen=True)
class Cost:
    """What a run costs: seconds per training step and its rollout / signals / update
    split (``time_signals_reward``: the reward model's part of the signals), peak RSS (MB)
    and wall time (s); NaN where not measured."""

    time_step: float
    time_rollout: float
    time_signals: float
    time_signals_reward: float
    time_update: float
    peak_rss_mb: float
    wall_s: float

    @staticmethod
    def mean(costs: Sequence[Cost]) -> Cost:
        """The mean cost of several runs (their peak RSS: the largest)."""
        return Cost(
            time_step=_mean(c.time_step for c in costs),
            time_rollout=_mean(c.time_rollout for c in costs),
            time_signals=_mean(c.time_signals for c in costs),
            time_signals_reward=_mean(c.time_signals_reward for c in costs),
            time_update=_mean(c.time_update for c in costs),
            peak_rss_mb=max((c.peak_rss_mb for c in costs), default=_nan()),
            wall_s=_mean(c.wall_s for c in costs),
        )


#: The probes' results.csv columns, in report order.
PROBE_COLUMNS: tuple[str, ...] = (
    "probe_credit_corr",
    "probe_grad_cos",
    "probe_grad_split_half",
    "probe_oracle_credit_corr",
)
#: Columns of the credits compared on every run's batches: ``probe_credit_corr@<label>``.
COMPARED_PREFIX = "probe_credit_corr@"


@dataclass(frozen=True)
class Efficiency:
    """Sample efficiency of a held-out curve: normalized area, value at 25% / 50% budget."""

    auc: float
    at_25: float
    at_50: float


@dataclass(frozen=True)
class RunFigures:
    """One run's figures (module docstring); ``curve``: (step, train ``reward_mean``) per
    training step, ``held_curve``: (step, primary held-out metric) per evaluation."""

    final_train: float
    first_train: float
    primary: float
    held_sampled: float
    held_greedy: float
    curve: list[tuple[int, float]]
    held_curve: list[tuple[int, float]]
    cost: Cost
    efficiency: Efficiency
    probes_start: dict[str, float]
    probes_end: dict[str, float]


@dataclass
class StrategyStats:
    """Statistics of one strategy in one (setting, family) over its seeds."""

    strategy: str
    final_train: Interval
    primary: Interval
    held_sampled: Interval
    held_greedy: Interval
    diff_primary: Interval | None
    diff_train: Interval | None
    steps_to_threshold: list[int | None]
    cost: Cost
    auc: Interval
    at_25: Interval
    at_50: Interval
    probes_start: dict[str, Interval]
    probes_end: dict[str, Interval]


@dataclass
class SettingFamilyStats:
    setting: str
    family: str
    threshold: float | None
    strategies: dict[str, StrategyStats] = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    """The method against the baseline (and the control) over all (family, seed) pairs of
    ``setting``: the means of both on their common pairs, the paired differences, and the
    Holm-corrected decisions: ``sign`` is the verdict (+1 beats, -1 worse, 0 not
    distinguishable) or None with fewer than ``SummarySpec.min_pairs`` pairs (too few for
    one), ``p_holm`` its adjusted p (NaN then), the same for the control, and ``contrasts``
    the size of the setting's Holm family."""

    setting: SettingSpec
    spec: SummarySpec
    method_mean: float
    baseline_mean: float
    vs_baseline: Interval
    vs_control: Interval | None
    sign: int | None
    p_holm: float
    control_sign: int | None
    control_p_holm: float
    contrasts: int

    @property
    def text(self) -> str:
        """The verdict line of the report."""
        return verdict_text(self)


def _nan() -> float:
    return float("nan")


def _mean(xs: Iterable[float]) -> float:
    vals = [x for x in xs if not math.isnan(x)]
    return math.fsum(vals) / len(vals) if vals else _nan()


def last_value(rows: Sequence[dict[str, Any]], column: str) -> float:
    """``column`` at the last step of one run's ``rows`` that has it (NaN if none does)."""
    found = [r for r in rows if column in r]
    return float(max(found, key=lambda r: r["step"])[column]) if found else _nan()


def _interp(curve: Sequence[tuple[int, float]], step: float) -> float:
    for (s0, v0), (s1, v1) in itertools.pairwise(curve):
        if s0 <= step <= s1:
            return v0 if s1 == s0 else v0 + (v1 - v0) * (step - s0) / (s1 - s0)
    return _nan()


def efficiency(curve: Sequence[tuple[int, float]], budget: int) -> Efficiency:
    """Sample efficiency of a held-out ``curve`` [(step, value)] (sorted, finite values)
    over a budget of ``budget`` steps: the trapezoid mean over [first step, last step],
    and the values at 25% and 50% of the budget; NaN with fewer than two points."""
    if len(curve) < 2 or budget <= 0:
        return Efficiency(_nan(), _nan(), _nan())
    span = curve[-1][0] - curve[0][0]
    area = math.fsum((s1 - s0) * (v0 + v1) / 2 for (s0, v0), (s1, v1) in itertools.pairwise(curve))
    return Efficiency(
        area / span if span > 0 else _nan(),
        _interp(curve, 0.25 * budget),
        _interp(curve, 0.5 * budget),
    )


def compared_columns(rows: Iterable[dict[str, Any]]) -> list[str]:
    """The ``probe_credit_corr@<label>`` columns (``probes.compare``) present in ``rows``."""
    return sorted({k for r in rows for k in r if k.startswith(COMPARED_PREFIX)})


def _probe_ends(rows: Sequence[dict[str, Any]]) -> tuple[dict[str, float], dict[str, float]]:
    probed = sorted((r for r in rows if "probe_metric" in r), key=lambda r: r["step"])
    if not probed:
        return {}, {}
    columns = [*PROBE_COLUMNS, *compared_columns(probed)]

    def pick(r: dict[str, Any]) -> dict[str, float]:
        return {c: float(r.get(c, _nan())) for c in columns}

    return pick(probed[0]), pick(probed[-1])


def run_figures(rows: Sequence[dict[str, Any]], primary: str, final_window: int) -> RunFigures:
    """The per-run figures of one run's rows (see the module docstring)."""
    train = sorted(
        (r for r in rows if r["step"] >= 1 and "reward_mean" in r), key=lambda r: r["step"]
    )
    curve = [(int(r["step"]), float(r["reward_mean"])) for r in train]
    timed = [r for r in train if "time_step" in r]
    if len(timed) > 1:
        timed = [r for r in timed if r["step"] > 1]

    def tmean(col: str) -> float:
        return _mean(float(r[col]) for r in timed if col in r)

    held = sorted(
        (int(r["step"]), float(r[primary]))
        for r in rows
        if primary in r and not math.isnan(float(r[primary]))
    )
    start, end = _probe_ends(rows)
    return RunFigures(
        final_train=_mean(v for _, v in curve[-final_window:]),
        first_train=curve[0][1] if curve else _nan(),
        primary=last_value(rows, primary),
        held_sampled=last_value(rows, "eval_reward_sampled"),
        held_greedy=last_value(rows, "eval_reward_greedy"),
        curve=curve,
        held_curve=held,
        cost=Cost(
            time_step=tmean("time_step"),
            time_rollout=tmean("time_rollout"),
            time_signals=tmean("time_signals"),
            time_signals_reward=tmean("time_signals_reward"),
            time_update=tmean("time_update"),
            peak_rss_mb=last_value(rows, "peak_rss_mb"),
            wall_s=last_value(rows, "wall_s"),
        ),
        efficiency=efficiency(held, max((int(r["step"]) for r in rows), default=0)),
        probes_start=start,
        probes_end=end,
    )


def steps_to_threshold(
    curve: Sequence[tuple[int, float]], threshold: float, smooth: int
) -> int | None:
    """First step at which the mean of the last ``w = min(smooth, len(curve))`` values
    reaches ``threshold`` (tested from the w-th step on), or None."""
    w = min(smooth, len(curve))
    values = [v for _, v in curve]
    for i in range(w - 1, len(curve)):
        if math.fsum(values[i - w + 1 : i + 1]) / w >= threshold:
            return curve[i][0]
    return None


def group_runs(rows: Iterable[dict[str, Any]]) -> dict[RunKey, list[dict[str, Any]]]:
    runs: dict[RunKey, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        key = RunKey(row["setting"], row["family"], row["strategy"], int(row["seed"]))
        runs[key].append(row)
    return dict(runs)


def _interval(values: Sequence[float], confidence: float) -> Interval:
    return mean_interval([v for v in values if not math.isnan(v)], confidence)


def _paired(a: dict[int, float], b: dict[int, float], confidence: float) -> Interval:
    keep_a = {k: v for k, v in a.items() if not math.isnan(v)}
    keep_b = {k: v for k, v in b.items() if not math.isnan(v)}
    return paired_difference(keep_a, keep_b, confidence)


def summarize(
    rows: Iterable[dict[str, Any]], spec: SummarySpec
) -> tuple[list[SettingFamilyStats], list[Verdict]]:
    """Statistics per (setting, family, strategy) and one verdict per setting."""
    figures: dict[RunKey, RunFigures] = {}
    by_setting = {s.name: s for s in spec.settings}
    for key, run_rows in group_runs(rows).items():
        if key.setting in by_setting:
            figures[key] = run_figures(run_rows, by_setting[key.setting].primary, spec.final_window)
    tables: list[SettingFamilyStats] = []
    verdicts: list[Verdict] = []
    for s in spec.settings:
        families = list(dict.fromkeys(k.family for k in figures if k.setting == s.name))
        pairs_base: dict[tuple[str, int], float] = {}
        pairs_method: dict[tuple[str, int], float] = {}
        pairs_control: dict[tuple[str, int], float] = {}
        for family in families:
            runs = {k: f for k, f in figures.items() if k.setting == s.name and k.family == family}
            threshold = s.threshold
            if threshold is None:
                threshold = _auto_threshold(runs, spec.strategies)
            table = SettingFamilyStats(s.name, family, threshold)
            per = {
                strat: {k.seed: f for k, f in runs.items() if k.strategy == strat}
                for strat in spec.strategies
            }
            base = per.get(spec.baseline, {})
            for strat in spec.strategies:
                seeds = per[strat]
                if not seeds:
                    continue
                ordered = [seeds[x] for x in sorted(seeds)]
                prim = {x: f.primary for x, f in seeds.items()}
                train = {x: f.final_train for x, f in seeds.items()}
                is_base = strat == spec.baseline
                table.strategies[strat] = StrategyStats(
                    strategy=strat,
                    final_train=_interval([f.final_train for f in ordered], spec.confidence),
                    primary=_interval([f.primary for f in ordered], spec.confidence),
                    held_sampled=_interval([f.held_sampled for f in ordered], spec.confidence),
                    held_greedy=_interval([f.held_greedy for f in ordered], spec.confidence),
                    diff_primary=None
                    if is_base or not base
                    else _paired(prim, {x: f.primary for x, f in base.items()}, spec.confidence),
                    diff_train=None
                    if is_base or not base
                    else _paired(
                        train, {x: f.final_train for x, f in base.items()}, spec.confidence
                    ),
                    steps_to_threshold=[
                        None
                        if threshold is None
                        else steps_to_threshold(f.curve, threshold, spec.smooth)
                        for f in ordered
                    ],
                    cost=Cost.mean([f.cost for f in ordered]),
                    auc=_interval([f.efficiency.auc for f in ordered], spec.confidence),
                    at_25=_interval([f.efficiency.at_25 for f in ordered], spec.confidence),
                    at_50=_interval([f.efficiency.at_50 for f in ordered], spec.confidence),
                    probes_start=_probe_intervals([f.probes_start for f in ordered], spec),
                    probes_end=_probe_intervals([f.probes_end for f in ordered], spec),
                )
            tables.append(table)
            roles = [(pairs_base, spec.baseline), (pairs_method, spec.method)]
            if spec.control is not None:
                roles.append((pairs_control, spec.control))
            for target, strat in roles:
                for seed, f in per.get(strat, {}).items():
                    target[(family, seed)] = f.primary
        if pairs_base and pairs_method:
            verdicts.append(_verdict(s, spec, pairs_method, pairs_base, pairs_control))
    return tables, verdicts


def _probe_intervals(values: Sequence[dict[str, float]], spec: SummarySpec) -> dict[str, Interval]:
    columns = dict.fromkeys([*PROBE_COLUMNS, *(c for v in values for c in v)])
    return {c: _interval([v.get(c, _nan()) for v in values], spec.confidence) for c in columns}


def _auto_threshold(runs: dict[RunKey, RunFigures], strategies: Sequence[str]) -> float | None:
    first = _mean(f.first_train for f in runs.values())
    finals = [
        _mean(f.final_train for k, f in runs.items() if k.strategy == strat) for strat in strategies
    ]
    best = max((x for x in finals if not math.isnan(x)), default=_nan())
    if math.isnan(first) or math.isnan(best) or best <= first:
        return None
    return first + 0.5 * (best - first)


def contrasts(n: int) -> str:
    """``1 contrast``, ``3 contrasts``."""
    return f"{n} contrast" + ("" if n == 1 else "s")


def fmt(x: float, digits: int = 3, signed: bool = False) -> str:
    if x is None or math.isnan(x):
        return "n/a"
    return f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}"


def fmt_p(p: float) -> str:
    """``p = 0.036``, ``p < 0.001`` (a p-value too small for three decimals), ``p = n/a``."""
    return "p < 0.001" if p < 0.0005 else f"p = {fmt(p)}"


def fmt_interval(iv: Interval | None, digits: int = 3, signed: bool = False) -> str:
    """``0.412 [0.381, 0.443]``; the bounds are left out when there is one value."""
    if iv is None or iv.n == 0:
        return "n/a"
    head = fmt(iv.mean, digits, signed)
    if iv.n < 2:
        return f"{head} (n=1)"
    return f"{head} [{fmt(iv.low, digits, signed)}, {fmt(iv.high, digits, signed)}]"


def _verdict(
    s: SettingSpec,
    spec: SummarySpec,
    method: dict[tuple[str, int], float],
    base: dict[tuple[str, int], float],
    control: dict[tuple[str, int], float],
) -> Verdict:
    def paired(a: dict[tuple[str, int], float], b: dict[tuple[str, int], float]) -> Interval:
        common = sorted(set(a) & set(b))
        idx = {k: i for i, k in enumerate(common)}
        return _paired(
            {idx[k]: a[k] for k in common}, {idx[k]: b[k] for k in common}, spec.confidence
        )

    vs_base = paired(method, base)
    vs_control = paired(method, control) if control else None
    diffs = [vs_base] if vs_control is None else [vs_base, vs_control]
    if spec.primary_family is None:
        decided = decide(diffs, spec.min_pairs, 1.0 - spec.confidence)
    else:  # secondary: the verdicts are the primary family's
        decided = [Decision(None, _nan(), 0)] * len(diffs)
    common = set(method) & set(base)
    return Verdict(
        setting=s,
        spec=spec,
        method_mean=_mean(method[k] for k in common),
        baseline_mean=_mean(base[k] for k in common),
        vs_baseline=vs_base,
        vs_control=vs_control,
        sign=decided[0].sign,
        p_holm=decided[0].p_holm,
        control_sign=decided[-1].sign if vs_control is not None else None,
        control_p_holm=decided[-1].p_holm if vs_control is not None else _nan(),
        contrasts=decided[0].family,
    )


def verdict_text(v: Verdict) -> str:
    """The verdict line: the decision, the primary metric named, the means, the paired
    difference with its unadjusted interval, the Holm-adjusted p and the family size, and
    the control. With a primary family (``SummarySpec.primary_family``) the line is
    secondary: the same numbers, unadjusted, and no decision."""
    s, spec, vs_base, vs_control = v.setting, v.spec, v.vs_baseline, v.vs_control
    pct = f"{round(spec.confidence * 100)}%"
    if spec.primary_family is not None:
        head = f"secondary, no verdict: {spec.method} vs {spec.baseline}"
    elif vs_base.n < 2:
        head = f"{spec.method} vs {spec.baseline}: one pair only, no interval"
    elif v.sign is None:
        head = (
            f"too few pairs for a verdict on {spec.method} vs {spec.baseline} "
            f"(n={vs_base.n} < {spec.min_pairs})"
        )
    elif v.sign > 0:
        head = f"**{spec.method} beats {spec.baseline}**"
    elif v.sign < 0:
        head = f"**{spec.method} is worse than {spec.baseline}**"
    else:
        head = f"**no significant difference** between {spec.method} and {spec.baseline}"
    text = (
        f"{s.title}: {head}: held-out {s.metric_label} (primary metric `{s.primary}`) "
        f"{fmt(v.method_mean)} vs {fmt(v.baseline_mean)}, "
        f"paired difference {fmt(vs_base.mean, signed=True)}"
    )
    if vs_base.n >= 2:
        text += (
            f" ({pct} CI {fmt(vs_base.low, signed=True)} to {fmt(vs_base.high, signed=True)},"
            f" n={vs_base.n} family x seed pairs; interval unadjusted)"
        )
    if v.sign is not None:
        text += (
            f", paired t-test Holm-adjusted {fmt_p(v.p_holm)} "
            f"(Holm-corrected over {contrasts(v.contrasts)} in this setting)"
        )
    if vs_control is not None and vs_control.n > 0:
        if spec.primary_family is not None:
            word = f"{pct} CI {fmt(vs_control.low, signed=True)} to "
            word += f"{fmt(vs_control.high, signed=True)}, unadjusted; secondary"
        elif v.control_sign is not None:
            word = {1: "above", -1: "below", 0: "not distinguishable from"}[v.control_sign] + " it"
        else:
            word = "too few pairs to tell against it"
        text += (
            f"; against the {spec.control} control {fmt(vs_control.mean, signed=True)} ({word})"
            if vs_control.n >= 2
            else f"; against the {spec.control} control {fmt(vs_control.mean, signed=True)} (n=1)"
        )
    return text + "."
