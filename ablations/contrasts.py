"""Every contrast of a setting decided together: Holm's correction per setting.

A setting's family is every paired contrast the report draws a verdict from in it: the
method against the baseline and against the control (``summary.Verdict``), each contender
against each published baseline over all families and per family (``HeadToHead``), and
each contender against the best baseline on the judging seeds (``BestBaseline``); those with
at least ``min_pairs`` pairs are decided by their paired t-tests, Holm-corrected over the
family at level 1 - confidence (``stats.decide``; docs/design.md, "Evaluation"). The
entropy line (``entropy_top`` minus ``random_top``) is not a member: it only ever claims
"no difference", which an unadjusted interval claims less often than an adjusted one.

Where the config declares a primary family (``SummarySpec.primary_family``), the verdicts
are that family's (``ablations.primary``) and none of these contrasts is decided: they are
secondary, given with their unadjusted intervals only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ablations.head_to_head import SettingHeadToHead
from ablations.stats import Interval, decide
from ablations.summary import SummarySpec, Verdict


def judge(
    verdicts: Sequence[Verdict], compared: Sequence[SettingHeadToHead], spec: SummarySpec
) -> tuple[list[Verdict], list[SettingHeadToHead]]:
    """``verdicts`` and ``compared`` with every decision taken per setting over the
    setting's whole family (module docstring); the intervals are unchanged. With a primary
    family both come back as given: undecided (secondary)."""
    if spec.primary_family is not None:
        return list(verdicts), list(compared)
    by_setting = {c.setting: c for c in compared}
    alpha = 1.0 - spec.confidence
    out_verdicts: list[Verdict] = []
    out_compared: dict[str, SettingHeadToHead] = {}
    for s in spec.settings:
        verdict = next((v for v in verdicts if v.setting.name == s.name), None)
        setting = by_setting.get(s.name)
        own = [] if verdict is None else [verdict.vs_baseline]
        if verdict is not None and verdict.vs_control is not None:
            own.append(verdict.vs_control)
        rows = [] if setting is None else setting.rows
        best = [] if setting is None else setting.against_best
        diffs: list[Interval] = [*own, *(c.diff for c in rows), *(b.judged for b in best)]
        decided = decide(diffs, spec.min_pairs, alpha)
        family = decided[0].family if decided else 0
        mine, on_rows, on_best = (
            decided[: len(own)],
            decided[len(own) : len(own) + len(rows)],
            decided[len(own) + len(rows) :],
        )
        if verdict is not None:
            control = mine[1] if len(mine) == 2 else None
            out_verdicts.append(
                dataclasses.replace(
                    verdict,
                    sign=mine[0].sign,
                    p_holm=mine[0].p_holm,
                    control_sign=None if control is None else control.sign,
                    control_p_holm=verdict.control_p_holm if control is None else control.p_holm,
                    contrasts=family,
                )
            )
        if setting is not None:
            out_compared[s.name] = dataclasses.replace(
                setting,
                rows=[
                    dataclasses.replace(c, sign=d.sign, p_holm=d.p_holm)
                    for c, d in zip(rows, on_rows, strict=True)
                ],
                against_best=[
                    dataclasses.replace(b, sign=d.sign, p_holm=d.p_holm)
                    for b, d in zip(best, on_best, strict=True)
                ],
                contrasts=family,
            )
    return out_verdicts, [out_compared.get(c.setting, c) for c in compared]
