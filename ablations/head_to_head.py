"""The methods under test against the published token-credit baselines, per setting.

For each setting, each contender (e.g. ``datc``, ``datc_mid``) and each published baseline
(``entropy_top``, ``random_top``, ``abc``, ``red``): the paired difference of the held-out
primary metric over the (family, seed) pairs both ran, over all families and per family,
and a verdict where there are at least ``SummarySpec.min_pairs`` pairs. The *best*
baseline of a setting is the one with the highest mean primary metric over its runs there;
the contenders' difference to it is the headline of the comparison. "Best" means the best
among the baselines that ran; each setting's section names them, and, given the strongest
baselines of a reference report (``strongest_baselines``, written beside every report as
``STRONGEST_FILE``), names the reference's strongest baseline where it did not run here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ablations.stats import Interval, paired_difference
from ablations.summary import SummarySpec, fmt, fmt_interval, group_runs, run_figures

#: Which pairs a comparison covers: every family, or one.
ALL_FAMILIES = "all"
#: The strongest published baseline of each setting of a report, written beside it (JSON).
STRONGEST_FILE = "strongest_baselines.json"


@dataclass(frozen=True)
class HeadToHead:
    """``contender`` minus ``baseline`` on ``setting``'s primary metric, over the pairs of
    ``family`` (``ALL_FAMILIES`` or one family); ``sign`` +1 / -1 / 0 as ``Interval``'s
    ``excludes_zero``, None with fewer than ``min_pairs`` pairs."""

    setting: str
    contender: str
    baseline: str
    family: str
    diff: Interval
    sign: int | None


@dataclass(frozen=True)
class SettingHeadToHead:
    """One setting's comparisons, the published baselines that ran there (in config order)
    and the best of them (None: none ran)."""

    setting: str
    title: str
    best: str | None
    ran: list[str]
    rows: list[HeadToHead]


def head_to_head(
    rows: Iterable[dict[str, object]],
    spec: SummarySpec,
    contenders: Sequence[str],
    published: Sequence[str],
) -> list[SettingHeadToHead]:
    """The comparisons of every setting of ``spec`` (module docstring)."""
    by_setting = {s.name: s for s in spec.settings}
    primary: dict[tuple[str, str], dict[tuple[str, int], float]] = {}
    for key, run_rows in group_runs(rows).items():
        s = by_setting.get(key.setting)
        if s is None or key.strategy not in (*contenders, *published):
            continue
        value = run_figures(run_rows, s.primary, spec.final_window).primary
        if not math.isnan(value):
            primary.setdefault((key.setting, key.strategy), {})[(key.family, key.seed)] = value
    out = []
    for s in spec.settings:
        ran = [b for b in published if primary.get((s.name, b))]
        best = max(ran, key=lambda b: _mean(primary[(s.name, b)].values()), default=None)
        comparisons = []
        for contender in contenders:
            mine = primary.get((s.name, contender), {})
            if not mine:
                continue
            for baseline in ran:
                theirs = primary[(s.name, baseline)]
                families = sorted({f for f, _ in mine} & {f for f, _ in theirs})
                for family in (ALL_FAMILIES, *families):
                    diff = _paired(mine, theirs, family, spec.confidence)
                    sign = diff.excludes_zero() if diff.n >= spec.min_pairs else None
                    comparisons.append(HeadToHead(s.name, contender, baseline, family, diff, sign))
        out.append(SettingHeadToHead(s.name, s.title, best, ran, comparisons))
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


def _paired(
    a: dict[tuple[str, int], float],
    b: dict[tuple[str, int], float],
    family: str,
    confidence: float,
) -> Interval:
    common = sorted(k for k in set(a) & set(b) if family in (ALL_FAMILIES, k[0]))
    return paired_difference(
        {i: a[k] for i, k in enumerate(common)}, {i: b[k] for i, k in enumerate(common)}, confidence
    )


def _cell(c: HeadToHead) -> str:
    mark = {1: " **+**", -1: " **−**", 0: " ·", None: " (too few pairs)"}[c.sign]
    return f"{fmt_interval(c.diff, signed=True)}{mark}"


def head_to_head_markdown(
    comparisons: Sequence[SettingHeadToHead],
    min_pairs: int,
    reference: Mapping[str, str] | None = None,
    reference_name: str = "",
) -> str:
    """The report section: per setting, the baselines that ran, a line naming the
    ``reference`` report's strongest baseline (setting -> label, from ``reference_name``)
    where it did not run here, one line per contender on the best baseline that ran, then a
    table of the contenders' paired differences to every baseline (all families, then each
    family)."""
    lines = [
        "## Against the published baselines",
        "",
        "Paired difference of the held-out primary metric (contender minus baseline, mean "
        "[95% interval] over the (family, seed) pairs both ran; **+** the contender is "
        "better, **−** worse, · not distinguishable; no verdict below "
        f"{min_pairs} pairs). The best baseline of a setting is the one with the highest "
        "mean held-out metric there among the baselines that ran in this report.",
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
        lines.append("")
        for c in setting.rows:
            if c.baseline == setting.best and c.family == ALL_FAMILIES:
                verdict = {1: "beats", -1: "is worse than", 0: "ties with", None: "vs"}[c.sign]
                lines.append(
                    f"- `{c.contender}` {verdict} the best baseline `{setting.best}`: "
                    f"{fmt(c.diff.mean, signed=True)} "
                    f"[{fmt(c.diff.low, signed=True)}, {fmt(c.diff.high, signed=True)}], "
                    f"n={c.diff.n}"
                )
        lines += [
            "",
            "| contender | pairs | " + " | ".join(f"vs `{b}`" for b in baselines) + " |",
            "|---|---|" + "---|" * len(baselines),
        ]
        keys = list(dict.fromkeys((c.contender, c.family) for c in setting.rows))
        for contender, family in keys:
            cells = {
                c.baseline: _cell(c)
                for c in setting.rows
                if c.contender == contender and c.family == family
            }
            lines.append(
                f"| `{contender}` | {family} | "
                + " | ".join(cells.get(b, "n/a") for b in baselines)
                + " |"
            )
    return "\n".join(lines)
