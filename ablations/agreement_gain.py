"""Does the direction model's measured agreement predict what its credit gains?

Every run of a strategy that reads a direction model logs, each step, the within-group
Spearman agreement of that model's scores with the reward (``credit/direction_agreement``,
results.csv column ``credit_direction_agreement``; docs/design.md, "Trusting the direction
model"). For each (setting, strategy) with such runs, this pairs over the (family, seed)
pairs the run's **early agreement**, the mean of its first ``EARLY_STEPS`` finite values
(what a user sees in a run's first steps, before deciding to trust its credit), with its
**gain**: its primary held-out metric minus that of GRPO trained the same way (the config's
``uniform`` strategy whose ``train`` overrides equal this strategy's, e.g. the same learning
rate; ``same_training_grpo``) on the same pair. Per (setting, strategy): Spearman's rho of
gain on early agreement across the pairs, and the mean gain of the pairs whose early
agreement is below ``SPLIT`` and of those at or above it. Secondary: no verdict is drawn.

Two measures (``AgreementMeasure``): ``SCORE``, the agreement of the direction model's scores,
split at 0.2 (the score gate's ``low`` as configs/ablate/gate.yaml pre-registered it, above what
an unrelated model gives over a step's groups); and ``ATTRIBUTION``, the agreement of each
response's summed reward attribution (``credit/attribution_agreement``, logged where a step
computes the attribution), split at 0.05 (the attribution gate's ``low``,
configs/ablate/gate_attribution.yaml). Each gets its section where runs logged it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scipy import stats

from ablations.ablation_config import AblateConfig
from ablations.head_to_head import Pair, primary_values
from ablations.summary import SummarySpec, fmt, group_runs

#: Logged steps whose agreement is averaged: about the gate's EMA horizon at decay 0.9.
EARLY_STEPS = 10


@dataclass(frozen=True)
class AgreementMeasure:
    """One logged agreement: its results.csv ``column`` and trainer ``metric``, what it
    ``ranks`` against the reward (the report's words), the ``split`` of the pairs (the
    pre-registered ``low`` of the gate on it) and the ``figure`` file's stem."""

    column: str
    metric: str
    ranks: str
    split: float
    figure: str


SCORE = AgreementMeasure(
    "credit_direction_agreement",
    "credit/direction_agreement",
    "the direction model's scores",
    0.2,
    "agreement_gain",
)
ATTRIBUTION = AgreementMeasure(
    "credit_attribution_agreement",
    "credit/attribution_agreement",
    "each response's summed reward attribution, sum_t (e_t - e_null) . g_t,",
    0.05,
    "attribution_gain",
)
MEASURES = (SCORE, ATTRIBUTION)


@dataclass(frozen=True)
class AgreementPoint:
    """One (family, seed) pair of a strategy in a setting: its early agreement and gain."""

    pair: Pair
    agreement: float
    gain: float


@dataclass(frozen=True)
class AgreementGain:
    """The points of one strategy in one setting against ``baseline`` (GRPO trained the same
    way) on one ``measure``, Spearman's ``rho`` across them (NaN under 3 points or a constant
    side), and the mean gain below and at or above ``measure.split`` (NaN where no pair is)."""

    setting: str
    strategy: str
    baseline: str
    points: tuple[AgreementPoint, ...]
    measure: AgreementMeasure = SCORE

    @property
    def rho(self) -> float:
        if len(self.points) < 3:
            return math.nan
        agreement = [p.agreement for p in self.points]
        gain = [p.gain for p in self.points]
        if len(set(agreement)) < 2 or len(set(gain)) < 2:
            return math.nan
        return float(stats.spearmanr(agreement, gain).statistic)

    def split(self, below: bool) -> tuple[float, int]:
        """(mean gain, pairs) of the points below ``measure.split`` (``below``) or at or
        above it."""
        gains = [p.gain for p in self.points if (p.agreement < self.measure.split) == below]
        return (math.fsum(gains) / len(gains) if gains else math.nan), len(gains)


def same_training_grpo(cfg: AblateConfig) -> dict[str, str]:
    """label -> the label of the config's ``uniform`` strategy with the same ``train``
    overrides, for every other strategy that has one."""
    grpo = {
        repr(sorted(s.train.items())): s.label for s in cfg.strategies if s.credit.name == "uniform"
    }
    out = {}
    for s in cfg.strategies:
        match = grpo.get(repr(sorted(s.train.items())))
        if s.credit.name != "uniform" and match is not None:
            out[s.label] = match
    return out


def early_agreement(
    rows: Sequence[Mapping[str, Any]], measure: AgreementMeasure = SCORE
) -> float | None:
    """Mean of the first ``EARLY_STEPS`` finite values of ``measure`` in one run's rows (by
    step); None when the run logged none."""
    ordered = sorted(rows, key=lambda r: int(r["step"]))
    logged = (r.get(measure.column) for r in ordered)
    values = [float(v) for v in logged if v not in (None, "") and not math.isnan(float(v))]
    values = values[:EARLY_STEPS]
    return math.fsum(values) / len(values) if values else None


def agreement_gains(
    rows: Iterable[dict[str, Any]],
    spec: SummarySpec,
    cfg: AblateConfig,
    measure: AgreementMeasure = SCORE,
) -> list[AgreementGain]:
    """Each (setting, strategy) whose runs logged ``measure``, in the config's order."""
    rows = list(rows)
    baselines = same_training_grpo(cfg)
    primary = primary_values(rows, spec, spec.strategies)
    early = {
        (key.setting, key.strategy, (key.family, key.seed)): value
        for key, run_rows in group_runs(rows).items()
        if (value := early_agreement(run_rows, measure)) is not None
    }
    out = []
    for setting in (s.name for s in spec.settings):
        for strategy, baseline in baselines.items():
            base = primary.get((setting, baseline), {})
            own = primary.get((setting, strategy), {})
            points = []
            for pair in sorted(set(own) & set(base)):
                agreement = early.get((setting, strategy, pair))
                gain = own[pair] - base[pair]
                if agreement is not None and not math.isnan(gain):
                    points.append(AgreementPoint(pair, agreement, gain))
            if points:
                out.append(AgreementGain(setting, strategy, baseline, tuple(points), measure))
    return out


def agreement_markdown(tables: Sequence[AgreementGain], figure: str | None) -> str:
    """The report's section on agreement and gain (module docstring) for the measure of
    ``tables`` (all of one), with its figure."""
    m = tables[0].measure
    what = "direction model's agreement" if m is SCORE else "attribution agreement"
    split = m.split
    parts = [
        f"## Does the {what} predict the gain? (secondary)",
        "",
        "Per (setting, strategy): each (family, seed) pair's early agreement (the mean of the "
        f"first {EARLY_STEPS} logged `{m.metric}` values: the within-group "
        f"rank correlation of {m.ranks} with the reward) against its gain "
        "(primary held-out metric minus GRPO trained the same way, same pair). rho: Spearman "
        f"across the pairs. Split at {split} (the pre-registered `low` of the gate on it). "
        "No verdict is drawn here.",
        "",
        "| setting | strategy | GRPO row | pairs | early agreement (min to max) | rho | "
        f"mean gain, agreement < {split} (pairs) | mean gain, >= {split} (pairs) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for t in tables:
        lo, hi = min(p.agreement for p in t.points), max(p.agreement for p in t.points)
        below, above = t.split(below=True), t.split(below=False)
        parts.append(
            f"| {t.setting} | `{t.strategy}` | `{t.baseline}` | {len(t.points)} | "
            f"{fmt(lo)} to {fmt(hi)} | {fmt(t.rho)} | {fmt(below[0], signed=True)} "
            f"({below[1]}) | {fmt(above[0], signed=True)} ({above[1]}) |"
        )
    if figure is not None:
        parts += ["", f"![{what} and gain]({figure})"]
    return "\n".join(parts)
