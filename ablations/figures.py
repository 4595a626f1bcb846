"""PNG figures (matplotlib, Agg backend): reward curves, credit probes and a credit heat-map.

- ``plot_curves``: one column per model family; top row the training reward per step, bottom
  row the held-out reward at evaluation steps; one line per strategy (mean over seeds) with
  its shaded Student-t interval (no shading with a single seed).
- ``plot_probes``: one column per model family; one row per credit probe (``probe_*``
  columns: exact-credit correlation, gradient cosine, its split-half reliability) over the
  evaluation steps; one line per strategy (mean over the seeds that have a value) with its
  interval.
- ``plot_head_to_head``: one panel per contender (``datc``, ``datc_mid``), one row per
  (setting, published baseline): the paired difference of the held-out metric over all
  (family, seed) pairs with its interval, a vertical line at 0 (``ablations.head_to_head``).
- ``plot_sweep``: one sweep (``ablations.sweeps``): each strategy's paired difference to the
  baseline against the swept parameter (or a declared sweep's measured axis), one line per
  strategy with its interval as error bars, the baseline's own mean in a panel beside it.
- ``plot_credit``: a few sampled responses, one row each, every token a cell colored by its
  DATC weight w_t = A_t / A (1 = what GRPO gives every token; the color scale is centered
  at 1), with the token text written in the cell (``backends.samples.heatmap``, the
  heat-map the trainers log to TensorBoard).
"""

from __future__ import annotations

import math
import textwrap
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ablations.agreement_gain import AgreementGain
from ablations.head_to_head import ALL_FAMILIES, SettingHeadToHead
from ablations.stats import mean_interval
from ablations.sweeps import SweepTable
from backends.samples.heatmap import credit_figure, pyplot


def _band(
    per_step: Mapping[int, list[float]], confidence: float
) -> tuple[list[int], list[float], list[float], list[float]]:
    steps, mean, low, high = [], [], [], []
    for step in sorted(per_step):
        iv = mean_interval(per_step[step], confidence)
        steps.append(step)
        mean.append(iv.mean)
        low.append(iv.low if iv.n > 1 else iv.mean)
        high.append(iv.high if iv.n > 1 else iv.mean)
    return steps, mean, low, high


def plot_curves(
    path: Path,
    *,
    title: str,
    rows: Iterable[dict[str, Any]],
    families: Sequence[str],
    strategies: Sequence[str],
    confidence: float = 0.95,
    baseline: str | None = None,
    smooth: int = 1,
) -> Path:
    """Write the reward-curve figure of one setting to ``path`` (PNG); each run's training
    reward is a trailing moving average of ``smooth`` steps before the mean over seeds. The
    ``baseline``
    strategy is drawn black and dashed, on top (others often overlap it early on: runs of
    one seed share their sampling seeds, so small updates give nearly the same samples)."""
    plt = pyplot()
    data: dict[tuple[str, str, str], dict[int, list[float]]] = defaultdict(
        lambda: defaultdict(list)
    )
    train: dict[tuple[str, str, int], list[tuple[int, float]]] = defaultdict(list)
    for r in rows:
        key = (r["family"], r["strategy"])
        if "eval_reward_sampled" in r:
            data[(*key, "eval")][int(r["step"])].append(float(r["eval_reward_sampled"]))
        if "reward_mean" in r and r["step"] >= 1:
            train[(*key, int(r["seed"]))].append((int(r["step"]), float(r["reward_mean"])))
    for (family, strat, _), points in train.items():
        values = [v for _, v in sorted(points)]
        for i, (step, _) in enumerate(sorted(points)):
            window = values[max(0, i + 1 - smooth) : i + 1]
            data[(family, strat, "train")][step].append(sum(window) / len(window))
    fig, axes = plt.subplots(
        2,
        len(families),
        figsize=(max(7.0, 5.0 * len(families)), 6.4),
        squeeze=False,
        sharex="col",
        layout="constrained",
    )
    colors = plt.get_cmap("tab10")
    for col, family in enumerate(families):
        train_label = "train reward" + (f" ({smooth}-step average)" if smooth > 1 else "")
        for row, (panel, label) in enumerate(
            (("train", train_label), ("eval", "held-out reward (sampled)"))
        ):
            ax = axes[row][col]
            for i, strat in enumerate(strategies):
                per_step = data.get((family, strat, panel))
                if not per_step:
                    continue
                steps, mean, low, high = _band(per_step, confidence)
                style: dict[str, Any] = {"marker": "o", "markersize": 3} if panel == "eval" else {}
                color: Any = colors(i % 10)
                if strat == baseline:
                    color = "black"
                    style.update(linestyle="--", zorder=5)
                ax.plot(steps, mean, color=color, label=strat, linewidth=1.5, **style)
                ax.fill_between(steps, low, high, color=color, alpha=0.15, linewidth=0)
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
            if row == 0:
                ax.set_title(family)
            else:
                ax.set_xlabel("step")
    handles, labels = axes[0][0].get_legend_handles_labels()
    return _finish(fig, path, f"{title}\nmean over seeds", confidence, handles, labels)


#: Probe columns and their axis labels, in figure order.
PROBE_PANELS: tuple[tuple[str, str], ...] = (
    ("probe_credit_corr", "corr(A_t, exact credit)"),
    ("probe_grad_cos", "cos(batch grad, true grad)"),
    ("probe_grad_split_half", "split-half cos of true grad"),
    ("probe_oracle_credit_corr", "oracle (exact swaps) corr"),
)


def plot_probes(
    path: Path,
    *,
    title: str,
    rows: Iterable[dict[str, Any]],
    families: Sequence[str],
    strategies: Sequence[str],
    confidence: float = 0.95,
    baseline: str | None = None,
) -> Path:
    """Write the credit-probe figure of one setting to ``path`` (PNG): one row of panels
    per probe of ``PROBE_PANELS`` that has values in ``rows``."""
    plt = pyplot()
    data: dict[tuple[str, str, str], dict[int, list[float]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for r in rows:
        for column, _ in PROBE_PANELS:
            value = r.get(column)
            if value is not None and not math.isnan(float(value)):
                data[(r["family"], r["strategy"], column)][int(r["step"])].append(float(value))
    measured = {column for (_, _, column) in data}  # a probe off in this run has no panel
    panels = [(column, label) for column, label in PROBE_PANELS if column in measured]
    panels = panels or list(PROBE_PANELS[:1])
    fig, axes = plt.subplots(
        len(panels),
        len(families),
        figsize=(max(7.0, 5.0 * len(families)), 2.5 * len(panels)),
        squeeze=False,
        sharex="col",
        layout="constrained",
    )
    colors = plt.get_cmap("tab10")
    for col, family in enumerate(families):
        for row, (column, label) in enumerate(panels):
            ax = axes[row][col]
            for i, strat in enumerate(strategies):
                per_step = data.get((family, strat, column))
                if not per_step:
                    continue
                steps, mean, low, high = _band(per_step, confidence)
                color: Any = "black" if strat == baseline else colors(i % 10)
                style = "--" if strat == baseline else "-"
                ax.plot(steps, mean, style, color=color, label=strat, marker="o", markersize=3)
                ax.fill_between(steps, low, high, color=color, alpha=0.15, linewidth=0)
            ax.axhline(0.0, color="grey", linewidth=0.8)
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
            if row == 0:
                ax.set_title(family)
            if row == len(panels) - 1:
                ax.set_xlabel("step")
    legend: dict[str, Any] = {}
    for ax in axes.flat:  # uniform credit has no correlation: its line is in other panels
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    labels = [x for x in strategies if x in legend]
    handles = [legend[x] for x in labels]
    title = f"{title}: credit probes\nmean over seeds"
    return _finish(fig, path, title, confidence, handles, labels)


def _save(fig: Any, path: Path) -> Path:
    """Save ``fig`` to ``path`` (PNG, its folder made) and close it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path


def _finish(
    fig: Any, path: Path, title: str, confidence: float, handles: list[Any], labels: list[str]
) -> Path:
    """Legend and title (with the interval's level) as ``_legend_and_title`` lays them out,
    saved as PNG."""
    pct = f"{round(confidence * 100)}%"
    _legend_and_title(fig, f"{title}, shaded {pct} interval", handles, labels)
    return _save(fig, path)


def _legend_and_title(fig: Any, title: str, handles: list[Any], labels: list[str]) -> None:
    """The legend below the panels in as many columns as fit across ``fig`` (at most 7), and
    ``title`` with each of its lines wrapped to the figure's width."""
    across = _characters_across(fig, 10)  # the legend's and the title's font size
    if handles:
        column = max(len(label) for label in labels) + 6  # the line sample and the padding
        ncol = max(1, min(len(labels), 7, across // column))
        fig.legend(handles, labels, loc="outside lower center", ncol=ncol, frameon=False)
    lines = title.split("\n")
    fig.suptitle("\n".join(textwrap.fill(line, across) for line in lines), fontsize=10)


def _characters_across(fig: Any, fontsize: float) -> int:
    """How many characters of ``fontsize`` points fit across ``fig``: an average glyph of
    matplotlib's default sans-serif is at most about 0.6 em wide."""
    return int(fig.get_figwidth() * 72 / (0.6 * fontsize))


def plot_head_to_head(path: Path, comparisons: Sequence[SettingHeadToHead]) -> Path:
    """Write the contenders-versus-published-baselines figure to ``path`` (PNG)."""
    plt = pyplot()
    pooled = [c for s in comparisons for c in s.rows if c.family == ALL_FAMILIES]
    contenders = list(dict.fromkeys(c.contender for c in pooled))
    rows = list(dict.fromkeys((c.setting, c.baseline) for c in pooled))
    fig, axes = plt.subplots(
        1,
        max(1, len(contenders)),
        figsize=(4.5 * max(1, len(contenders)), 0.32 * len(rows) + 1.6),
        squeeze=False,
        sharey="row",
        layout="constrained",
    )
    colors = plt.get_cmap("tab10")
    baselines = list(dict.fromkeys(b for _, b in rows))
    for col, contender in enumerate(contenders):
        ax = axes[0][col]
        for y, (setting, baseline) in enumerate(rows):
            hit = next(
                (
                    c
                    for c in pooled
                    if (c.contender, c.setting, c.baseline) == (contender, setting, baseline)
                ),
                None,
            )
            if hit is None or hit.diff.n < 2:
                continue
            color = colors(baselines.index(baseline) % 10)
            ax.errorbar(
                hit.diff.mean,
                y,
                xerr=[[hit.diff.mean - hit.diff.low], [hit.diff.high - hit.diff.mean]],
                fmt="o",
                color=color,
                markersize=4,
                capsize=2,
            )
        ax.axvline(0.0, color="grey", linewidth=0.8)
        ax.set_yticks(range(len(rows)), [f"{s} vs {b}" for s, b in rows], fontsize=7)
        ax.set_title(f"{contender} minus baseline", fontsize=9)
        ax.set_xlabel("paired difference, held-out metric")
        ax.grid(alpha=0.3, axis="x")
    axes[0][0].invert_yaxis()  # the axes share y: invert once, settings in config order
    fig.suptitle(
        "Against the published baselines: mean over (family, seed) pairs, 95% interval "
        "(unadjusted)",
        fontsize=10,
    )
    return _save(fig, path)


def plot_sweep(path: Path, table: SweepTable) -> Path:
    """Write the figure of one sweep to ``path`` (PNG): left, each curve of ``table`` against
    the swept parameter (a declared sweep's: its measured axis, ``Sweep.spans``), its points
    shifted a little sideways so that the intervals of one value do not hide each other;
    right, the baseline's mean there (measured: with each point's range of the axis)."""
    plt = pyplot()
    sweep = table.sweep
    fig, (ax, base_ax) = plt.subplots(
        1, 2, figsize=(10.0, 4.8), width_ratios=(3, 1), layout="constrained"
    )
    n = len(table.curves)
    colors = plt.get_cmap("tab20")  # its dark colors first (tab10's), then the light ones
    shift = 0.006 * (max(sweep.values) - min(sweep.values))
    for i, curve in enumerate(table.curves):
        points = [(v, d) for v, d in zip(sweep.values, curve.diffs, strict=True) if d]
        ax.errorbar(
            [v + (i - (n - 1) / 2) * shift for v, _ in points],
            [d.mean for _, d in points],
            yerr=[[d.mean - d.low for _, d in points], [d.high - d.mean for _, d in points]],
            marker="o",
            markersize=4,
            capsize=3,
            color=colors((2 * i) % 20 + (i // 10) % 2),
            label=curve.strategy,
        )
    ax.axhline(0.0, color="black", linestyle="--", linewidth=1.0, label=table.baseline)
    ax.set_ylabel(f"minus {table.baseline}, paired")
    if sweep.spans is None:
        base_ax.plot(sweep.values, table.baseline_means, "o--", color="black")
    else:  # each point's measured range over its RMs, as horizontal bars
        base_ax.errorbar(
            sweep.values,
            table.baseline_means,
            xerr=[
                [v - lo for v, (lo, _) in zip(sweep.values, sweep.spans, strict=True)],
                [hi - v for v, (_, hi) in zip(sweep.values, sweep.spans, strict=True)],
            ],
            fmt="o--",
            color="black",
            capsize=3,
        )
    base_ax.set_ylabel(f"{table.baseline}, mean over pairs")
    measured = sweep.spans is not None
    ticks = [f"{v:.3f}" if measured else f"{v:g}" for v in sweep.values]
    ax.set_xticks(sweep.values, ticks, rotation=45 if measured else 0)
    if not measured:  # a measured axis: the ranges reach past the points, plain ticks there
        base_ax.set_xticks(sweep.values, ticks)
    for a in (ax, base_ax):
        a.set_xlabel(f"{sweep.param} (measured)" if measured else sweep.param)
        a.grid(alpha=0.3)
    head = f"{sweep.label} ({sweep.kind})" if measured else sweep.kind
    _legend_and_title(
        fig,
        f"{head}: {table.metric_label} against {sweep.param}\n"
        "paired difference over (family, seed) pairs, 95% interval (unadjusted)",
        *ax.get_legend_handles_labels(),
    )
    return _save(fig, path)


def plot_agreement(path: Path, tables: Sequence[AgreementGain]) -> Path:
    """Write the agreement-and-gain figure to ``path`` (PNG): a panel per strategy, each
    (family, seed) pair a point (early agreement, gain over GRPO trained the same way),
    coloured by setting; the measure's split and zero gain dashed."""
    plt = pyplot()
    strategies = list(dict.fromkeys(t.strategy for t in tables))
    settings = list(dict.fromkeys(t.setting for t in tables))
    fig, axes = plt.subplots(
        1,
        len(strategies),
        figsize=(3.6 * len(strategies), 3.6),
        squeeze=False,
        sharey=True,
        layout="constrained",
    )
    colors = plt.get_cmap("tab10")
    for ax, strategy in zip(axes[0], strategies, strict=True):
        for t in (t for t in tables if t.strategy == strategy):
            ax.scatter(
                [p.agreement for p in t.points],
                [p.gain for p in t.points],
                s=18,
                color=colors(settings.index(t.setting) % 10),
                label=t.setting,
            )
        ax.axvline(tables[0].measure.split, color="grey", linestyle="--", linewidth=0.8)
        ax.axhline(0.0, color="black", linestyle="--", linewidth=0.8)
        ax.set_title(strategy, fontsize=9)
        ax.set_xlabel("early agreement (first steps)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("gain over GRPO, held-out")
    handles, labels = axes[0][0].get_legend_handles_labels()
    seen = dict(zip(labels, handles, strict=True))
    for ax in axes[0][1:]:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(label, handle)
    metric = tables[0].measure.metric
    title = f"Early {metric} against the gain, per (family, seed)"
    _legend_and_title(fig, title, list(seen.values()), list(seen))
    return _save(fig, path)


def plot_credit(path: Path, *, title: str, examples: Sequence[Mapping[str, Any]]) -> Path:
    """Write a credit heat-map of ``examples`` (``backends.samples.heatmap.credit_figure``)
    to ``path`` (PNG)."""
    fig = credit_figure(title=title, examples=examples)
    return _save(fig, path)


def is_png(path: Path) -> bool:
    """True if ``path`` starts with the PNG signature and matplotlib can read it back."""
    with open(path, "rb") as fh:
        if fh.read(8) != b"\x89PNG\r\n\x1a\n":
            return False
    plt = pyplot()
    image = plt.imread(path)
    return bool(image.ndim == 3 and image.shape[0] > 0 and not math.isnan(float(image.mean())))
