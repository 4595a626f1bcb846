"""The agreement gate's two pre-registered criteria (``report.gate_criteria``; issue 46,
docs/design.md, "Trusting the direction model"), judged on the runs' primary held-out metric
over the (family, seed) pairs both strategies and GRPO ran:

- **floor** (each ``weak`` setting): the gated strategy is no worse than GRPO, i.e. the
  ``confidence`` Student-t interval of (gated - GRPO) has its lower bound above ``floor``;
- **keep** (each ``good`` setting): the gated strategy keeps at least ``keep`` of the ungated
  strategy's gain, i.e. mean(gated - GRPO) / mean(ungated - GRPO) >= ``keep``. The per-pair
  shortfall (gated - GRPO) - keep (ungated - GRPO) is shown with its interval (a positive
  mean is the same statement as the ratio's); where the ungated strategy gains nothing
  (mean <= 0) there is no gain to keep and the criterion is not judged.

Fewer than ``min_pairs`` pairs: the numbers are shown, the criterion is not judged. GRPO's row
is the config's ``baseline`` (the gate's runs all train the same way).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ablations.ablation_config import GateCriteriaConfig
from ablations.head_to_head import Pair, primary_values
from ablations.stats import Interval, mean_interval
from ablations.summary import SummarySpec, fmt, fmt_interval


@dataclass(frozen=True)
class FloorCheck:
    """The floor criterion on one weak setting: ``diff`` = gated - GRPO over the pairs."""

    setting: str
    diff: Interval
    floor: float
    min_pairs: int

    @property
    def met(self) -> bool | None:
        """None below ``min_pairs`` pairs."""
        if self.diff.n < self.min_pairs:
            return None
        return self.diff.low > self.floor


@dataclass(frozen=True)
class KeepCheck:
    """The keep criterion on one good setting: ``gated`` and ``ungated`` minus GRPO and the
    per-pair ``shortfall`` (gated - GRPO) - keep (ungated - GRPO), over the same pairs."""

    setting: str
    gated: Interval
    ungated: Interval
    shortfall: Interval
    keep: float
    min_pairs: int

    @property
    def kept(self) -> float:
        """mean(gated - GRPO) / mean(ungated - GRPO); NaN where the ungated gain is <= 0."""
        if math.isnan(self.ungated.mean) or self.ungated.mean <= 0:
            return math.nan
        return self.gated.mean / self.ungated.mean

    @property
    def met(self) -> bool | None:
        """None below ``min_pairs`` pairs or without an ungated gain."""
        if self.gated.n < self.min_pairs or math.isnan(self.kept):
            return None
        return self.kept >= self.keep


@dataclass(frozen=True)
class GateCriteria:
    """Both criteria, one check per named setting (in the config's order)."""

    config: GateCriteriaConfig
    baseline: str
    floor: tuple[FloorCheck, ...]
    keep: tuple[KeepCheck, ...]


def _diffs(a: Mapping[Pair, float], b: Mapping[Pair, float], pairs: Sequence[Pair]) -> list[float]:
    return [a[p] - b[p] for p in pairs]


def gate_criteria(
    rows: Iterable[dict[str, Any]], spec: SummarySpec, gate: GateCriteriaConfig
) -> GateCriteria:
    """The criteria of ``gate`` on the result rows (``spec.baseline`` is GRPO's row)."""
    labels = [gate.gated, gate.ungated, spec.baseline]
    primary = primary_values(rows, spec, labels)

    def runs(setting: str, label: str) -> dict[Pair, float]:
        return primary.get((setting, label), {})

    floor = []
    for setting in gate.weak:
        gated, base = runs(setting, gate.gated), runs(setting, spec.baseline)
        pairs = sorted(set(gated) & set(base))
        diff = mean_interval(_diffs(gated, base, pairs), spec.confidence)
        floor.append(FloorCheck(setting, diff, gate.floor, spec.min_pairs))
    keep = []
    for setting in gate.good:
        gated, ungated = runs(setting, gate.gated), runs(setting, gate.ungated)
        base = runs(setting, spec.baseline)
        pairs = sorted(set(gated) & set(ungated) & set(base))
        g = _diffs(gated, base, pairs)
        u = _diffs(ungated, base, pairs)
        short = [x - gate.keep * y for x, y in zip(g, u, strict=True)]
        keep.append(
            KeepCheck(
                setting,
                mean_interval(g, spec.confidence),
                mean_interval(u, spec.confidence),
                mean_interval(short, spec.confidence),
                gate.keep,
                spec.min_pairs,
            )
        )
    return GateCriteria(gate, spec.baseline, tuple(floor), tuple(keep))


def _verdict(met: bool | None) -> str:
    return {True: "**met**", False: "**not met**", None: "not judged"}[met]


def gate_criteria_markdown(result: GateCriteria, confidence: float) -> str:
    """The report's section on the gate's criteria (module docstring)."""
    g = result.config
    level = f"{confidence:.0%}"
    parts = [
        "## The gate's criteria (pre-registered)",
        "",
        f"Named in the config before the runs. Floor: where the direction model is weak, "
        f"`{g.gated}` - `{result.baseline}` has its {level} interval's lower bound above "
        f"{fmt(g.floor, signed=True)}. Keep: where it is good, `{g.gated}` keeps at least "
        f"{g.keep:.0%} of `{g.ungated}`'s gain over `{result.baseline}` (mean over the pairs "
        f"all three ran; shortfall: per pair (`{g.gated}` - GRPO) - {g.keep} (`{g.ungated}` "
        "- GRPO), its mean >= 0 exactly when the ratio is met). Primary held-out metric.",
        "",
        "| criterion | setting | pairs | gated - GRPO | ungated - GRPO | kept | shortfall | "
        "verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for f in result.floor:
        parts.append(
            f"| floor {fmt(f.floor, signed=True)} | {f.setting} | {f.diff.n} | "
            f"{fmt_interval(f.diff, signed=True)} | | | | {_verdict(f.met)} |"
        )
    for k in result.keep:
        kept = "n/a (no gain)" if math.isnan(k.kept) else f"{k.kept:.0%}"
        parts.append(
            f"| keep {k.keep:.0%} | {k.setting} | {k.gated.n} | "
            f"{fmt_interval(k.gated, signed=True)} | {fmt_interval(k.ungated, signed=True)} | "
            f"{kept} | {fmt_interval(k.shortfall, signed=True)} | {_verdict(k.met)} |"
        )
    return "\n".join(parts)
