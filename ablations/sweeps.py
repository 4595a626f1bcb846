"""Sweeps: one built-in setting run under several names at several values of one parameter.

A config may run one setting kind under several names with different params (``sweep_24``,
``sweep_96``, ``sweep_192``: the length task at 24, 96 and 192 response words). Where two or
more settings share a kind and their params differ in exactly one numeric parameter, and
they are judged on the same primary metric, they form a ``Sweep``: the report then puts each
strategy's paired difference to the baseline side by side against that parameter, in one
table and one figure (``figures.plot_sweep``). The numbers are the settings' own: paired over
every (family, seed) pair both ran (``head_to_head.paired_over``), unadjusted 95% intervals;
the verdicts stay the settings' (Holm-corrected within each setting) or, where the config
declares one, the primary family's; none is drawn here. Where the primary family picks
GRPO's row among its learning rates (``primary.BaselinePick``), the baseline at each point
is that point's pick, named "GRPO".

A config may also declare a sweep (``report.sweeps``: a name, settings of one kind judged on
one metric, and an ``axis``): settings that differ in the direction model's knobs, not in one
number, put side by side against a MEASURED figure of their direction models, the mean over
each setting's (policy, RM) pairs of ``rm_corr`` or ``rm_pair_accuracy`` on the step-0
policy's own samples (``sample_fidelity.AXES``; ``measured_sweep``), in increasing order of
it, each point with its range over the pairs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ablations.head_to_head import ALL_FAMILIES, paired_over, primary_values
from ablations.sample_fidelity import AXES, SettingFidelity
from ablations.stats import Interval
from ablations.summary import SummarySpec, fmt, fmt_interval


@dataclass(frozen=True)
class Sweep:
    """Settings of one ``kind`` that differ only in ``param``: ``settings[i]`` ran at
    ``values[i]``, in increasing order of the value. A declared sweep (``measured_sweep``)
    has its config ``name`` and ``spans``: the (min, max) of the measured ``param`` over each
    point's (policy, RM) pairs, its value the mean."""

    kind: str
    param: str
    settings: tuple[str, ...]
    values: tuple[float, ...]
    name: str | None = None
    spans: tuple[tuple[float, float], ...] | None = None

    @property
    def label(self) -> str:
        """The sweep's name in the report and its figure's file: its config name, or its kind."""
        return self.kind if self.name is None else self.name

    def value_text(self, i: int) -> str:
        """Point ``i``'s value: ``96`` / ``0.5``; measured, ``0.881 (0.866 to 0.897)``."""
        v = self.values[i]
        if self.spans is None:
            return str(int(v)) if v.is_integer() else f"{v:g}"
        low, high = self.spans[i]
        return f"{v:.3f}" if low == high else f"{v:.3f} ({low:.3f} to {high:.3f})"


@dataclass(frozen=True)
class SweepCurve:
    """``strategy`` minus the baseline at each point of a sweep (None: it did not run there,
    or fewer than two pairs)."""

    strategy: str
    diffs: tuple[Interval | None, ...]


@dataclass(frozen=True)
class SweepTable:
    """A sweep's baseline mean at each point (NaN: it did not run there) and one curve per
    other strategy, in config order. ``rows``: the baseline's label at each point;
    ``picked``: GRPO's row is picked per setting (``baseline`` is then "GRPO"), else
    ``baseline`` is the one label of ``rows``."""

    sweep: Sweep
    baseline: str
    metric_label: str
    baseline_means: tuple[float, ...]
    curves: tuple[SweepCurve, ...]
    rows: tuple[str, ...]
    picked: bool


def find_sweeps(
    settings: Mapping[str, tuple[str, Mapping[str, object]]], primary: Mapping[str, str]
) -> list[Sweep]:
    """The sweeps among ``settings`` (name -> (kind, params)), in the order their kinds first
    appear: every kind with two or more settings whose params differ in exactly one key,
    numeric and distinct in each of them, and whose ``primary`` metrics (name -> results.csv
    column) are the same. Other groups of one kind are no sweep (several parameters move at
    once, or the settings are judged on different metrics)."""
    by_kind: dict[str, list[str]] = {}
    for name, (kind, _) in settings.items():
        by_kind.setdefault(kind, []).append(name)
    sweeps = []
    for kind, names in by_kind.items():
        if len(names) < 2 or len({primary[n] for n in names}) != 1:
            continue
        params = [settings[n][1] for n in names]
        keys = set().union(*(p.keys() for p in params))
        moving = [k for k in sorted(keys) if len({repr(p.get(k)) for p in params}) > 1]
        if len(moving) != 1:
            continue
        points = sorted(
            (float(v), name)
            for name, v in zip(names, (p.get(moving[0]) for p in params), strict=True)
            if isinstance(v, int | float) and not isinstance(v, bool)
        )
        if len({v for v, _ in points}) == len(names):  # numeric and distinct at every point
            sweeps.append(
                Sweep(kind, moving[0], tuple(n for _, n in points), tuple(v for v, _ in points))
            )
    return sweeps


def measured_sweep(
    name: str,
    kind: str,
    settings: Sequence[str],
    axis: str,
    fidelity: Mapping[str, SettingFidelity],
) -> Sweep:
    """The declared sweep ``name`` over ``settings`` (of one ``kind``), ordered by their
    measured ``axis`` (``SettingFidelity.axis``: the mean over each setting's pairs; module
    docstring). ValueError naming the settings without a measurement of it."""
    missing = [s for s in settings if s not in fidelity or fidelity[s].axis(axis).n == 0]
    if missing:
        raise ValueError(
            f"sweep {name!r}: settings {missing} have no measured {axis} (their runs record no "
            "info.policy_samples, or only NaN)"
        )
    points = sorted(
        ((fidelity[s].axis(axis), i, s) for i, s in enumerate(settings)),
        key=lambda p: (p[0].mean, p[1]),
    )
    return Sweep(
        kind,
        axis,
        tuple(s for _, _, s in points),
        tuple(m.mean for m, _, _ in points),
        name,
        tuple((m.low, m.high) for m, _, _ in points),
    )


def sweep_table(
    rows: Iterable[dict[str, object]],
    spec: SummarySpec,
    sweep: Sweep,
    grpo: Mapping[str, str] | None = None,
) -> SweepTable:
    """Every strategy of ``spec`` but the baseline, minus the baseline, at each point of
    ``sweep`` (module docstring), with the baseline's mean there and the sweep's metric label
    (its settings', ``SettingSpec.metric_label``). ``grpo``: setting -> the label of GRPO's
    row there (the primary family's pick), the baseline at that point; a strategy gets no
    difference at a point where it is that row. None: ``spec.baseline`` everywhere."""
    primary = primary_values(rows, spec, spec.strategies)
    labels = tuple(
        spec.baseline if grpo is None else grpo.get(setting, spec.baseline)
        for setting in sweep.settings
    )
    bases = [primary.get(pt, {}) for pt in zip(sweep.settings, labels, strict=True)]
    means = tuple(math.fsum(b.values()) / len(b) if b else math.nan for b in bases)
    curves = []
    for strategy in spec.strategies:
        if all(strategy == label for label in labels):
            continue
        diffs = []
        for setting, label, base in zip(sweep.settings, labels, bases, strict=True):
            diff = paired_over(
                primary.get((setting, strategy), {}), base, ALL_FAMILIES, spec.confidence
            )
            diffs.append(diff if diff.n >= 2 and strategy != label else None)
        if any(d is not None for d in diffs):
            curves.append(SweepCurve(strategy, tuple(diffs)))
    label = next(s.metric_label for s in spec.settings if s.name == sweep.settings[0])
    name = spec.baseline if grpo is None else "GRPO"
    return SweepTable(sweep, name, label, means, tuple(curves), labels, grpo is not None)


def sweep_markdown(
    tables: Sequence[SweepTable], figures: Sequence[str], secondary: bool = False
) -> str:
    """The report's "Sweeps" section: one table per sweep (a row per strategy, a column per
    value of the parameter) followed by its figure (``figures[i]``, a path relative to the
    report); ``secondary``: the report has a primary family, which holds the verdicts."""
    verdicts = (
        "**Secondary**: the verdicts are the primary family's (above)"
        if secondary
        else "The verdicts are the settings' own (above)"
    )
    parts = [
        "## Sweeps",
        "",
        "Settings that are one built-in setting at several values of one parameter, side by "
        "side: each strategy's paired difference to the baseline on the primary held-out "
        f"metric, mean [95% interval, unadjusted] over every (family, seed) pair both ran. "
        f"{verdicts}; none is drawn here.",
    ]
    if any(t.sweep.spans is not None for t in tables):
        parts += [
            "",
            "A declared sweep (`report.sweeps`) orders settings that differ in their direction "
            "models by a measured figure of those models on the step-0 policy's own samples: "
            "its mean (min to max) over each setting's (policy, RM) pairs (the Direction "
            "models tables of the settings).",
        ]
    for table, figure in zip(tables, figures, strict=True):
        s = table.sweep
        header = " | ".join(
            f"{s.param} = {s.value_text(i)} (`{n}`)" for i, n in enumerate(s.settings)
        )
        picked = table.picked
        base = "GRPO" if picked else f"`{table.baseline}`"
        means = [
            fmt(m) + (f" (`{label}`)" if picked else "")
            for m, label in zip(table.baseline_means, table.rows, strict=True)
        ]
        parts += [
            "",
            (
                f"### `{s.kind}` against `{s.param}`: {table.metric_label}"
                if s.spans is None
                else f"### `{s.label}`: `{s.kind}` against measured `{s.param}` "
                f"({AXES[s.param]}): {table.metric_label}"
            ),
            "",
            f"| strategy | {header} |",
            "|---|" + "---|" * len(s.settings),
            f"| {base} (mean{'; its row at each point' if picked else ''}) | "
            + " | ".join(means)
            + " |",
        ]
        for curve in table.curves:
            cells = [
                fmt_interval(d, signed=True)
                if d
                else ("GRPO's row" if row == curve.strategy else "n/a")
                for d, row in zip(curve.diffs, table.rows, strict=True)
            ]
            parts.append(f"| `{curve.strategy}` - {base} | " + " | ".join(cells) + " |")
        parts += ["", f"![sweep {s.label}]({figure})"]
    return "\n".join(parts)
