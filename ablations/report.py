"""report.md: a table per setting and family, one verdict line per setting, the figures.

Everything in it is computed by ``summary.summarize`` from results.csv; this module only
formats. Column meanings are spelled out at the top of the report.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ablations.stats import Interval
from ablations.summary import (
    COMPARED_PREFIX,
    PROBE_COLUMNS,
    SettingFamilyStats,
    StrategyStats,
    SummarySpec,
    Verdict,
    fmt,
    fmt_interval,
)


def _steps(st: StrategyStats) -> str:
    reached = [s for s in st.steps_to_threshold if s is not None]
    n = len(st.steps_to_threshold)
    if not reached:
        return f"not reached (0/{n})"
    return f"{math.fsum(reached) / len(reached):.1f} ({len(reached)}/{n})"


def _time(st: StrategyStats) -> str:
    c = st.cost
    if math.isnan(c.time_step):
        return "n/a"
    signals = f"{c.time_signals:.3f}"
    if not math.isnan(c.time_signals_reward):
        signals += f" [RM {c.time_signals_reward:.3f}]"
    return f"{c.time_step:.3f} ({c.time_rollout:.3f} / {signals} / {c.time_update:.3f})"


def _tally(verdicts: Sequence[Verdict], spec: SummarySpec) -> str:
    """One sentence on the claim "the method beats the baseline in every setting"."""
    signs = [v.sign for v in verdicts]
    better, worse, tie = signs.count(1), signs.count(-1), signs.count(0)
    too_few = signs.count(None)
    text = (
        f"In sum: `{spec.method}` beats `{spec.baseline}` in {better} of {len(verdicts)} "
        f"settings, is worse in {worse}, and is not distinguishable from it in {tie}"
    )
    if too_few:
        text += f"; {too_few} had too few pairs for a verdict (fewer than {spec.min_pairs})"
    return text + "."


def table_markdown(
    table: SettingFamilyStats, spec: SummarySpec, primary_label: str, primary_is_reward: bool
) -> str:
    """The Markdown table of one (setting, family)."""
    base = spec.baseline
    head = ["strategy", "final train reward"]
    if not primary_is_reward:
        head.append(f"held-out {primary_label} (sampled)")
    head += [
        "held-out reward (sampled)",
        "held-out reward (greedy)",
        f"Δ held-out {primary_label} vs {base}",
        f"Δ final train vs {base}",
        "steps to threshold",
        "s/step (rollout / signals [RM part] / update)",
        "peak RSS MB",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for st in table.strategies.values():
        cells = [f"`{st.strategy}`", fmt_interval(st.final_train)]
        if not primary_is_reward:
            cells.append(fmt_interval(st.primary))
        cells += [
            fmt_interval(st.held_sampled),
            fmt_interval(st.held_greedy),
            "(baseline)" if st.strategy == base else fmt_interval(st.diff_primary, signed=True),
            "(baseline)" if st.strategy == base else fmt_interval(st.diff_train, signed=True),
            _steps(st),
            _time(st),
            fmt(st.cost.peak_rss_mb, 0),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _span(a: Interval, b: Interval) -> str:
    if a.n == 0 and b.n == 0:
        return "n/a"
    return f"{fmt(a.mean, 2, signed=True)} → {fmt(b.mean, 2, signed=True)}"


def efficiency_markdown(table: SettingFamilyStats, primary_label: str) -> str:
    """Sample efficiency and the credit probes of one (setting, family)."""
    head = [
        "strategy",
        f"AUC held-out {primary_label}",
        "at 25% of steps",
        "at 50% of steps",
        "final",
        "credit corr (start → end)",
        "grad cos (start → end)",
        "split-half (start → end)",
        "oracle credit corr (start → end)",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for st in table.strategies.values():
        start, end = st.probes_start, st.probes_end
        cells = [
            f"`{st.strategy}`",
            fmt_interval(st.auc),
            fmt_interval(st.at_25),
            fmt_interval(st.at_50),
            fmt_interval(st.primary),
            *(_span(start[c], end[c]) for c in PROBE_COLUMNS),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def compared_markdown(table: SettingFamilyStats) -> str | None:
    """The credits of ``probes.compare`` judged on each run's batches (None if none)."""
    columns = sorted(
        {
            c
            for st in table.strategies.values()
            for c in st.probes_end
            if c.startswith(COMPARED_PREFIX)
        }
    )
    if not columns:
        return None
    labels = [c.removeprefix(COMPARED_PREFIX) for c in columns]
    head = [
        "run's strategy (its batches)",
        *(f"credit corr of `{x}` (start → end)" for x in labels),
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for st in table.strategies.values():
        cells = [f"`{st.strategy}`"]
        for c in columns:
            a, b = st.probes_start.get(c), st.probes_end.get(c)
            cells.append("n/a" if a is None or b is None else _span(a, b))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_report(
    *,
    title: str,
    command: str,
    spec: SummarySpec,
    tables: Sequence[SettingFamilyStats],
    verdicts: Sequence[Verdict],
    figures: Mapping[str, Sequence[Path]],
    setting_info: Mapping[str, Mapping[str, Any]],
    setting_tables: Mapping[str, str] | None = None,
    preamble: Sequence[str] = (),
    sections: Sequence[str] = (),
    primary: str | None = None,
    relative_to: Path,
) -> str:
    """The whole report.md text. ``figures`` maps a setting to its PNGs; ``setting_info``
    to facts about its models (pretraining loss, reward-model fit, ...); ``setting_tables``
    to a Markdown block on its models placed under them (the "Direction models" table,
    ``sample_fidelity.fidelity_markdown``, where its runs record one); ``sections``:
    Markdown sections placed after the verdicts; ``primary``: the primary-family section
    (``primary.primary_markdown``), given where the config declares one: it comes first and
    the method's lines follow it as secondary."""
    pct = f"{round(spec.confidence * 100)}%"
    if primary is None:
        verdict_section = [
            "## Verdicts",
            "",
            f"The method (`{spec.method}`) against the baseline (`{spec.baseline}`, plain GRPO) "
            "on each setting's primary held-out metric (named in the config before the runs, "
            "`settings.<name>.primary`; each line names it), paired over all (family, seed) "
            "pairs. A verdict is the paired t-test of the differences at "
            f"{round((1 - spec.confidence) * 100)}%, Holm-corrected over every contrast the "
            "report draws a verdict from in that setting (this one, the control, and the "
            "contrasts against the published baselines; each line gives the count); the "
            f"{pct} intervals are unadjusted.",
            "",
            *(f"- {v.text}" for v in verdicts),
            "",
            _tally(verdicts, spec),
        ]
    else:
        verdict_section = [
            primary,
            "",
            "## The method against the baseline (secondary)",
            "",
            f"The method (`{spec.method}`) against the configured baseline (`{spec.baseline}`)"
            + (f" and its control (`{spec.control}`)" if spec.control else "")
            + ", paired over all (family, seed) pairs: **secondary**, unadjusted "
            f"{pct} intervals, no verdict (the verdicts are the primary family's above).",
            "",
            *(f"- {v.text}" for v in verdicts),
        ]
    out = [
        f"# Ablation report: {title}",
        "",
        f"Produced by `{command}`.",
        *preamble,
        "",
        "How to read it. Every cell with brackets is a mean over seeds with its "
        f"{pct} Student-t interval. *Final train reward*: mean training reward of the last "
        f"{spec.final_window} steps. *Held-out*: the last evaluation on held-out prompts, "
        "sampled (mean over G samples per prompt at the training temperature) and greedy. "
        f"*Δ ... vs {spec.baseline}*: the paired difference to `{spec.baseline}` run with the "
        "same seed (same initial policy, same prompts order), mean and interval over seeds. "
        "*Steps to threshold*: first step whose trailing moving average "
        f"({spec.smooth} steps) of the training reward reaches the threshold, averaged over "
        "the seeds that reach it (reached/total). *s/step*: wall time per training step "
        "without the first, split into rollout / reward and credit signals / update; "
        "[RM ...]: the reward model's part of the signals (rewards and every reward-side "
        "signal: gradient, attention, prefix rewards). "
        "*Peak RSS*: the process's resident memory, sampled during the run (CPU).",
        "",
        "Sample efficiency and probes (second table of each setting). *AUC*: the held-out "
        "metric's mean over training (trapezoid area under its evaluations divided by the "
        "steps); *at 25% / 50%*: its value at that share of the step budget (interpolated). "
        'The probes (mean over seeds at the first → last evaluation; docs/design.md, "When '
        'token credit pays off"): *credit corr*: within-response correlation of the token '
        "advantages with the exact token credit of the setting's rule (n/a for uniform "
        "credit, which is constant in a response, and for settings without a per-token rule: "
        "the MiniLM similarity settings); *grad cos*: cosine between the batch policy "
        "gradient of the strategy's token advantages and a many-sample REINFORCE estimate of "
        "the exact metric's gradient; *split-half*: the cosine between two independent "
        "halves of that estimate (its reliability: a grad cos can only be read against it); "
        "*oracle credit corr*: the credit correlation of DATC's allocation fed the direction "
        "model's exact swap differences on the same batch (an upper bound, where computed). "
        "A third table, where the config compares credits (`probes.compare`), gives the "
        "credit correlation of those strategies on each run's own probe batches: credits "
        "judged at the same policy and samples.",
        "",
        *verdict_section,
    ]
    for section in sections:
        out += ["", section]
    for s in spec.settings:
        blocks = [t for t in tables if t.setting == s.name]
        if not blocks:
            continue
        out += ["", f"## {s.title}", ""]
        info = setting_info.get(s.name, {})
        if info:
            out.append("; ".join(f"{k}: {v}" for k, v in info.items()) + ".")
            out.append("")
        block = (setting_tables or {}).get(s.name)
        if block:
            out += [block, ""]
        primary_is_reward = s.primary == "eval_reward_sampled"
        for t in blocks:
            thr = (
                "automatic, none (no strategy improved)"
                if t.threshold is None
                else (f"{t.threshold:.3f}" + ("" if s.threshold is not None else " (automatic)"))
            )
            out += [
                f"### {t.family} (threshold {thr})",
                "",
                table_markdown(t, spec, s.metric_label, primary_is_reward),
                "",
                efficiency_markdown(t, s.metric_label),
                "",
            ]
            compared = compared_markdown(t)
            if compared is not None:
                out += [compared, ""]
        for fig in figures.get(s.name, ()):
            rel = fig.relative_to(relative_to) if fig.is_relative_to(relative_to) else fig
            out.append(f"![{fig.stem}]({rel.as_posix()})")
        out.append("")
    return "\n".join(out).rstrip() + "\n"
