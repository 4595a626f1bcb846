"""The methods under test against the published token-credit baselines, per setting.

For each setting, each contender (e.g. ``datc``, ``datc_mid``) and each published baseline
(``entropy_top``, ``random_top``, ``abc``, ``red``): the paired difference of the held-out
primary metric over the (family, seed) pairs both ran, over all families and per family.

The *best* baseline of a setting is picked on the first half of the seeds and judged on
the second (``split_seeds``: within each family, seeds in increasing order, the first
floor(k/2) of its k seeds pick, the others judge): the baseline with the highest mean
primary metric over its runs on the picking pairs. The contenders' difference to it on the
judging pairs is the headline (``BestBaseline``); with fewer judging pairs than
``SummarySpec.min_pairs`` there is no verdict and the section states the selection effect
instead (the difference on the picking half, on the judging half and over all pairs).
"Best" means the best among the baselines that ran; each setting's section names them, and,
given the strongest baselines of a reference report (``strongest_baselines``, written
beside every report as ``STRONGEST_FILE``), names the reference's strongest baseline where
it did not run here.

Verdicts (``sign``) come from ``contrasts.judge``: Holm-corrected over every contrast of
the setting; ``head_to_head`` alone leaves them None, and so does a report with a primary
family, where this whole section is secondary (unadjusted intervals, no verdict). Where
both ran, ``entropy_top`` minus ``random_top`` (its random control) is given with its
unadjusted interval (``entropy_vs_random``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ablations.stats import Interval, paired_difference
from ablations.summary import (
    RunFigures,
    SummarySpec,
    contrasts,
    fmt,
    fmt_interval,
    fmt_p,
    group_runs,
    run_figures,
)

#: Which pairs a comparison covers: every family, or one.
ALL_FAMILIES = "all"
#: The strongest published baseline of each setting of a report, written beside it (JSON).
STRONGEST_FILE = "strongest_baselines.json"


#: The 80/20-rule entropy mask and its random control (labels of the published baselines).
ENTROPY_PAIR = ("entropy_top", "random_top")

Pair = tuple[str, int]


@dataclass(frozen=True)
class HeadToHead:
    """``contender`` minus ``baseline`` on ``setting``'s primary metric, over the pairs of
    ``family`` (``ALL_FAMILIES`` or one family); ``sign`` +1 / -1 / 0 the Holm-corrected
    verdict (``contrasts.judge``), None without one (fewer than ``min_pairs`` pairs, or not
    judged yet); ``p_holm`` its adjusted p-value (NaN without a verdict)."""

    setting: str
    contender: str
    baseline: str
    family: str
    diff: Interval
    sign: int | None = None
    p_holm: float = float("nan")


@dataclass(frozen=True)
class BestBaseline:
    """``contender`` minus the setting's best baseline: on the pairs that picked it
    (``picking``), on the others (``judged``: the verdict's pairs) and on all (``pooled``);
    ``sign`` / ``p_holm`` as ``HeadToHead``'s, from ``judged``."""

    contender: str
    picking: Interval
    judged: Interval
    pooled: Interval
    sign: int | None = None
    p_holm: float = float("nan")


@dataclass(frozen=True)
class SettingHeadToHead:
    """One setting's comparisons, the published baselines that ran there (in config order),
    the best of them picked on ``picking`` (None: none ran), each contender against it, the
    pairs that judge it (``judging``), ``entropy_top`` minus ``random_top`` (None unless both
    ran) and the size of the setting's Holm family (``contrasts``; 0 until judged)."""

    setting: str
    title: str
    best: str | None
    ran: list[str]
    rows: list[HeadToHead]
    against_best: list[BestBaseline] = field(default_factory=list)
    picking: list[Pair] = field(default_factory=list)
    judging: list[Pair] = field(default_factory=list)
    entropy_vs_random: Interval | None = None
    contrasts: int = 0


def split_seeds(pairs: Iterable[Pair]) -> tuple[list[Pair], list[Pair]]:
    """(picking, judging): within each family its seeds in increasing order, the first
    floor(k/2) of its k seeds pick, the rest judge (an odd seed out judges)."""
    by_family: dict[str, list[int]] = {}
    for family, seed in sorted(set(pairs)):
        by_family.setdefault(family, []).append(seed)
    picking = [(f, s) for f, seeds in by_family.items() for s in seeds[: len(seeds) // 2]]
    judging = [(f, s) for f, seeds in by_family.items() for s in seeds[len(seeds) // 2 :]]
    return picking, judging


def head_to_head(
    rows: Iterable[dict[str, object]],
    spec: SummarySpec,
    contenders: Sequence[str],
    published: Sequence[str],
) -> list[SettingHeadToHead]:
    """The comparisons of every setting of ``spec`` (module docstring)."""
    primary = primary_values(rows, spec, (*contenders, *published))
    out = []
    for s in spec.settings:
        ran = [b for b in published if primary.get((s.name, b))]
        runs = [k for label in (*contenders, *ran) for k in primary.get((s.name, label), {})]
        picking, judging = split_seeds(runs)
        if not picking:  # one seed per family: nothing to pick on apart, pick on all
            picking, judging = judging, []
        best = max(
            (b for b in ran if set(primary[(s.name, b)]) & set(picking)),
            key=lambda b: _mean(
                primary[(s.name, b)][k] for k in picking if k in primary[(s.name, b)]
            ),
            default=None,
        )
        comparisons = []
        against_best = []
        for contender in contenders:
            mine = primary.get((s.name, contender), {})
            if not mine:
                continue
            for baseline in ran:
                theirs = primary[(s.name, baseline)]
                families = sorted({f for f, _ in mine} & {f for f, _ in theirs})
                for family in (ALL_FAMILIES, *families):
                    diff = paired_over(mine, theirs, family, spec.confidence)
                    comparisons.append(HeadToHead(s.name, contender, baseline, family, diff))
            if best is not None:
                theirs = primary[(s.name, best)]
                against_best.append(
                    BestBaseline(
                        contender,
                        picking=paired_over(mine, theirs, ALL_FAMILIES, spec.confidence, picking),
                        judged=paired_over(mine, theirs, ALL_FAMILIES, spec.confidence, judging),
                        pooled=paired_over(mine, theirs, ALL_FAMILIES, spec.confidence),
                    )
                )
        entropy, rand = (primary.get((s.name, label)) for label in ENTROPY_PAIR)
        out.append(
            SettingHeadToHead(
                s.name,
                s.title,
                best,
                ran,
                comparisons,
                against_best,
                picking,
                judging,
                paired_over(entropy, rand, ALL_FAMILIES, spec.confidence)
                if entropy and rand
                else None,
            )
        )
    return out


def strongest_baselines(comparisons: Sequence[SettingHeadToHead]) -> dict[str, dict[str, object]]:
    """setting -> {"best": the best baseline that ran, "ran": the baselines that ran}, for
    the settings where one ran (what ``STRONGEST_FILE`` holds)."""
    return {c.setting: {"best": c.best, "ran": c.ran} for c in comparisons if c.best is not None}


def read_strongest(path: str | Path) -> dict[str, str]:
    """setting -> strongest baseline, from a ``STRONGEST_FILE`` (JSON, read as data only).

    Raises ValueError naming the file and the entry that is not a
    ``{"best": label, "ran": [labels]}`` mapping."""
    raw = json.loads(Path(path).read_text())
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a mapping of setting -> {{best, ran}}")
    out = {}
    for setting, entry in raw.items():
        best = entry.get("best") if isinstance(entry, dict) else None
        if not isinstance(best, str):
            raise ValueError(f"{path}: {setting}: expected {{'best': label, 'ran': [labels]}}")
        out[setting] = best
    return out


def _mean(values: Iterable[float]) -> float:
    xs = list(values)
    return math.fsum(xs) / len(xs)


def run_figures_by_pair(
    rows: Iterable[dict[str, object]], spec: SummarySpec, labels: Iterable[str]
) -> dict[tuple[str, str], dict[Pair, RunFigures]]:
    """(setting, strategy) -> {(family, seed): the run's figures} (``summary.run_figures``),
    for the settings of ``spec`` and the strategies ``labels``; runs without a primary value
    are left out."""
    by_setting = {s.name: s for s in spec.settings}
    wanted = set(labels)
    out: dict[tuple[str, str], dict[Pair, RunFigures]] = {}
    for key, run_rows in group_runs(rows).items():
        s = by_setting.get(key.setting)
        if s is None or key.strategy not in wanted:
            continue
        figures = run_figures(run_rows, s.primary, spec.final_window)
        if not math.isnan(figures.primary):
            out.setdefault((key.setting, key.strategy), {})[(key.family, key.seed)] = figures
    return out


def primary_values(
    rows: Iterable[dict[str, object]], spec: SummarySpec, labels: Iterable[str]
) -> dict[tuple[str, str], dict[Pair, float]]:
    """``run_figures_by_pair``'s primary held-out metric of each run."""
    return {
        key: {pair: figures.primary for pair, figures in runs.items()}
        for key, runs in run_figures_by_pair(rows, spec, labels).items()
    }


def paired_over(
    a: Mapping[Pair, float],
    b: Mapping[Pair, float],
    family: str,
    confidence: float,
    among: Sequence[Pair] | None = None,
) -> Interval:
    """a - b over the pairs both ran, of ``family`` (``ALL_FAMILIES``: every family), among
    ``among`` (None: all)."""
    common = sorted(
        k
        for k in set(a) & set(b)
        if family in (ALL_FAMILIES, k[0]) and (among is None or k in among)
    )
    return paired_difference(
        {i: a[k] for i, k in enumerate(common)}, {i: b[k] for i, k in enumerate(common)}, confidence
    )


def _cell(c: HeadToHead, secondary: bool) -> str:
    if secondary:
        return fmt_interval(c.diff, signed=True)
    mark = {1: " **+**", -1: " **−**", 0: " ·", None: " (too few pairs)"}[c.sign]
    return f"{fmt_interval(c.diff, signed=True)}{mark}"


def _iv(iv: Interval) -> str:
    return f"{fmt_interval(iv, signed=True)} (n={iv.n})"


def _pairs_text(pairs: Sequence[Pair]) -> str:
    by_family: dict[str, list[int]] = {}
    for family, seed in pairs:
        by_family.setdefault(family, []).append(seed)
    return ", ".join(f"{f} {'/'.join(map(str, seeds))}" for f, seeds in by_family.items())


def best_line(
    setting: SettingHeadToHead, b: BestBaseline, min_pairs: int, secondary: bool = False
) -> str:
    """The headline of ``b.contender`` against the setting's best baseline: a verdict on the
    judging half (``secondary``: its unadjusted interval, no verdict), or, with fewer than
    ``min_pairs`` judging pairs, the selection effect."""
    best = f"`{setting.best}`"
    picked = f"picked on seeds {_pairs_text(setting.picking)}" + (
        f", judged on seeds {_pairs_text(setting.judging)}" if setting.judging else ""
    )
    if secondary and b.judged.n >= min_pairs:
        return (
            f"- `{b.contender}` minus the best baseline {best} ({picked}): {_iv(b.judged)} on "
            "the judging seeds (secondary: unadjusted interval, no verdict)"
        )
    if b.sign is not None:
        verdict = {1: "beats", -1: "is worse than", 0: "ties with"}[b.sign]
        return (
            f"- `{b.contender}` {verdict} the best baseline {best} ({picked}): "
            f"{_iv(b.judged)} on the judging seeds, Holm-adjusted {fmt_p(b.p_holm)}"
        )
    gap = b.judged.mean - b.picking.mean
    return (
        f"- `{b.contender}` vs the best baseline {best} ({picked}): too few pairs on the judging "
        f"seeds for a verdict (n={b.judged.n} < {min_pairs}). Selection effect: {best} was "
        f"picked as the best on the picking seeds, where `{b.contender}` minus it is "
        f"{_iv(b.picking)}; on the seeds not used to pick it {_iv(b.judged)}; the gap "
        f"{fmt(gap, signed=True)} estimates the selection effect (positive: the pick flattered "
        f"{best}); over all pairs, which include the picking ones, {_iv(b.pooled)}"
    )


def entropy_line(setting: SettingHeadToHead, min_pairs: int) -> str | None:
    """One line on ``entropy_top`` minus ``random_top`` (None unless both ran): where its
    unadjusted interval contains 0 over at least ``min_pairs`` pairs, that the entropy
    signal made no difference at this scale."""
    iv = setting.entropy_vs_random
    if iv is None or iv.n < 2:
        return None
    entropy, rand = (f"`{x}`" for x in ENTROPY_PAIR)
    head = f"- {entropy} minus its random control {rand}: {_iv(iv)}"
    if iv.n < min_pairs:
        return f"{head}: too few pairs to tell whether the entropy signal mattered."
    if iv.excludes_zero() == 0:
        return (
            f"{head}: **the entropy signal made no difference at this scale** (its unadjusted "
            "interval contains 0)."
        )
    word = "above" if iv.mean > 0 else "below"
    return f"{head}: the entropy mask is {word} its random control (unadjusted interval)."


def head_to_head_markdown(
    comparisons: Sequence[SettingHeadToHead],
    min_pairs: int,
    reference: Mapping[str, str] | None = None,
    reference_name: str = "",
    secondary: bool = False,
) -> str:
    """The report section: per setting, the baselines that ran, a line naming the
    ``reference`` report's strongest baseline (setting -> label, from ``reference_name``)
    where it did not run here, one line per contender on the best baseline (``best_line``),
    the entropy line (``entropy_line``), then a table of the contenders' paired differences
    to every baseline (all families, then each family). ``secondary`` (a report with a
    primary family): titled and worded as secondary, intervals only, no verdicts."""
    if secondary:
        how = (
            "**Secondary** (not in the primary family): no verdict is drawn here. Paired "
            "difference of the held-out primary metric (contender minus baseline, mean [95% "
            "interval, unadjusted] over the (family, seed) pairs both ran)."
        )
    else:
        how = (
            "Paired difference of the held-out primary metric (contender minus baseline, mean "
            "[95% interval, unadjusted] over the (family, seed) pairs both ran; **+** the "
            "contender is better, **−** worse, · not distinguishable, by the paired t-test "
            "Holm-corrected over every contrast of the setting (the verdicts above included); "
            f"no verdict below {min_pairs} pairs)."
        )
    lines = [
        "## Against the published baselines" + (" (secondary)" if secondary else ""),
        "",
        how + " The best baseline of a setting is picked on the "
        "first half of the seeds (in each family, the first half of its seeds in increasing "
        "order) as the one with the highest mean held-out metric there among the baselines "
        "that ran in this report, and judged on the second half only.",
    ]
    for setting in comparisons:
        if setting.best is None or not setting.rows:
            continue
        baselines = list(dict.fromkeys(c.baseline for c in setting.rows))
        lines += ["", f"### {setting.title}", ""]
        lines.append("Baselines that ran here: " + ", ".join(f"`{b}`" for b in setting.ran) + ".")
        strongest = (reference or {}).get(setting.setting)
        if strongest is not None and strongest not in setting.ran:
            lines.append(
                f"**The strongest baseline of {reference_name or 'the reference report'} for "
                f"this setting, `{strongest}`, did not run here**: the best baseline below is "
                "only the best of those that ran."
            )
        if not secondary:
            lines.append(
                f"Verdicts Holm-corrected over {contrasts(setting.contrasts)} in this setting."
            )
        lines.append("")
        lines += [best_line(setting, b, min_pairs, secondary) for b in setting.against_best]
        entropy = entropy_line(setting, min_pairs)
        if entropy is not None:
            lines.append(entropy)
        lines += [
            "",
            "| contender | pairs | " + " | ".join(f"vs `{b}`" for b in baselines) + " |",
            "|---|---|" + "---|" * len(baselines),
        ]
        keys = list(dict.fromkeys((c.contender, c.family) for c in setting.rows))
        for contender, family in keys:
            cells = {
                c.baseline: _cell(c, secondary)
                for c in setting.rows
                if c.contender == contender and c.family == family
            }
            lines.append(
                f"| `{contender}` | {family} | "
                + " | ".join(cells.get(b, "n/a") for b in baselines)
                + " |"
            )
    return "\n".join(lines)
