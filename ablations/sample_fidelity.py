"""The direction model's fidelity on the policy's own samples, per setting, for the report
(docs/design.md, "Evaluation" and "Direction-model fidelity and a peaked policy").

Every run of a setting that measures it records ``info.policy_samples``
(``policy_samples.SampleFit``: ``rm_corr``, ``rm_pair_accuracy``, ``entropy``,
``log_vocab``, ...) of its (policy, RM) pair, the step-0 policy and the direction model its
strategies read. The runs of one pair (every strategy of a (setting, family) and, with
``model_seeds``, seed) carry one record: ``setting_fidelity`` keeps one per pair (and
refuses two that differ) and summarizes each setting per family and over all families by
the mean and the range (min to max) over its pairs; these are measurements of models, not
samples of a population, so no interval is drawn. A NaN figure (``rm_corr`` of a constant
RM) is left out of its mean, and the count of pairs it comes from says so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ablations.results import RunKey
from ablations.summary import fmt

#: The figures of ``info.policy_samples`` a measured sweep may be ordered by -> their name.
AXES: dict[str, str] = {
    "rm_corr": "the RM's correlation (Pearson) with the exact score on the policy's samples",
    "rm_pair_accuracy": "the RM's pair accuracy on the policy's samples",
}
#: The family label of a setting's row over all its families.
ALL = "all"
RECORD = "policy_samples"


@dataclass(frozen=True)
class Spread:
    """The mean, smallest and largest of ``n`` finite values (NaN and n = 0 without any)."""

    mean: float
    low: float
    high: float
    n: int


def spread(values: Sequence[float]) -> Spread:
    """``Spread`` of the finite ``values`` (NaN ones are left out)."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return Spread(math.nan, math.nan, math.nan, 0)
    return Spread(math.fsum(finite) / len(finite), min(finite), max(finite), len(finite))


@dataclass(frozen=True)
class FidelityRow:
    """The (policy, RM) pairs of one family of a setting (``family`` ``ALL``: of all its
    families): ``pairs`` of them recorded, each figure's spread over them; ``entropy_share``
    is each pair's ``entropy / log_vocab``."""

    family: str
    pairs: int
    rm_corr: Spread
    rm_pair_accuracy: Spread
    entropy: Spread
    entropy_share: Spread
    log_vocab: Spread


@dataclass(frozen=True)
class SettingFidelity:
    """A setting's rows: one per family that recorded the figures, in the config's order, then
    the ``ALL`` row where there are several; ``unrecorded``: its runs' pairs without a record
    (older runs)."""

    setting: str
    rows: tuple[FidelityRow, ...]
    unrecorded: int

    @property
    def overall(self) -> FidelityRow:
        """The row over every family."""
        return self.rows[-1]

    def axis(self, name: str) -> Spread:
        """The setting's figure ``name`` (a key of ``AXES``) over all its pairs."""
        if name not in AXES:
            raise ValueError(f"axis: expected one of {sorted(AXES)}, got {name!r}")
        value: Spread = getattr(self.overall, name)
        return value


def _row(family: str, fits: Sequence[Mapping[str, float]]) -> FidelityRow:
    return FidelityRow(
        family,
        len(fits),
        spread([float(f["rm_corr"]) for f in fits]),
        spread([float(f["rm_pair_accuracy"]) for f in fits]),
        spread([float(f["entropy"]) for f in fits]),
        spread([float(f["entropy"]) / float(f["log_vocab"]) for f in fits]),
        spread([float(f["log_vocab"]) for f in fits]),
    )


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """The same figures, NaN equal to NaN."""
    return a.keys() == b.keys() and all(
        a[k] == b[k]
        or (
            isinstance(a[k], float)
            and isinstance(b[k], float)
            and math.isnan(a[k])
            and math.isnan(b[k])
        )
        for k in a
    )


def setting_fidelity(
    results: Mapping[RunKey, Mapping[str, Any]], families: Sequence[str], model_seeds: bool
) -> dict[str, SettingFidelity]:
    """Each setting whose runs (``results``: run -> its result.json) record
    ``info.policy_samples``, summarized (module docstring). A (policy, RM) pair is a
    (setting, family) and, with ``model_seeds``, a seed. ValueError naming both runs where
    two runs of one pair record different figures."""
    fits: dict[str, dict[tuple[str, int | None], tuple[RunKey, dict[str, float]]]] = {}
    unrecorded: dict[str, set[tuple[str, int | None]]] = {}
    for run in sorted(results):
        pair = (run.family, run.seed if model_seeds else None)
        fit = results[run].get("info", {}).get(RECORD)
        if fit is None:
            unrecorded.setdefault(run.setting, set()).add(pair)
            continue
        seen = fits.setdefault(run.setting, {}).get(pair)
        if seen is None:
            fits[run.setting][pair] = (run, dict(fit))
        elif not _same(seen[1], fit):
            raise ValueError(
                f"info.{RECORD}: runs {seen[0].relpath} and {run.relpath} share their policy "
                f"and RM but record different figures ({seen[1]} and {dict(fit)})"
            )
    out = {}
    for setting, by_pair in fits.items():
        rows = [
            _row(family, [f for (fam, _), (_, f) in by_pair.items() if fam == family])
            for family in families
            if any(fam == family for fam, _ in by_pair)
        ]
        if len(rows) > 1:
            rows.append(_row(ALL, [f for _, f in by_pair.values()]))
        missing = unrecorded.get(setting, set()) - set(by_pair)
        out[setting] = SettingFidelity(setting, tuple(rows), len(missing))
    return out


def fmt_spread(s: Spread, pairs: int, digits: int = 3) -> str:
    """``0.881 (0.866 to 0.897)``; the value alone where every pair gave the same; ``(k of
    n)`` where NaN figures of ``pairs`` were left out; ``n/a`` without any."""
    if s.n == 0:
        return "n/a"
    text = fmt(s.mean, digits)
    if s.low != s.high:
        text += f" ({fmt(s.low, digits)} to {fmt(s.high, digits)})"
    return text if s.n == pairs else f"{text} ({s.n} of {pairs})"


def fidelity_markdown(fidelity: SettingFidelity) -> str:
    """The "Direction models" table of one setting: a row per family (and over all), the
    RM's correlation and pair accuracy on the step-0 policy's samples and its sampling
    entropy, absolute and as a share of log V."""
    lines = [
        "**Direction models on the step-0 policy's own samples** (`info.policy_samples`: "
        "the step-0 policy's samples of the held-out prompts at temperature 1, scored by the "
        "exact rule and by the direction model the runs read; mean (min to max) over the "
        "(policy, RM) pairs, one per family and model seed):",
        "",
        "| family | (policy, RM) pairs | RM correlation (Pearson) | RM pair accuracy "
        "| sampling entropy (nats) | entropy / log V | log V |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in fidelity.rows:
        cells = [
            r.family,
            str(r.pairs),
            fmt_spread(r.rm_corr, r.pairs),
            fmt_spread(r.rm_pair_accuracy, r.pairs),
            fmt_spread(r.entropy, r.pairs),
            fmt_spread(r.entropy_share, r.pairs),
            fmt_spread(r.log_vocab, r.pairs),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if fidelity.unrecorded:
        lines += [
            "",
            f"{fidelity.unrecorded} (policy, RM) pairs of this setting ran without the record "
            "(older runs) and are not in the table.",
        ]
    return "\n".join(lines)
