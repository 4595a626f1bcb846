"""The figures of ``ablations.figures``: the credit-probe figure has one row of panels per
probe that the run measured, none for a probe that was off (e.g. the oracle without
``probes.oracle_k``); the title and legend of a curve figure and of a sweep figure stay
inside it however long the setting's and the strategies' names are."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest

from ablations import figures
from ablations.figures import PROBE_PANELS, is_png, plot_probes
from ablations.stats import Interval
from ablations.sweeps import Sweep, SweepCurve, SweepTable


def _png_height(path: Path) -> int:
    header = path.read_bytes()[:24]
    (height,) = struct.unpack(">I", header[20:24])
    return int(height)


def _rows(columns: list[str]) -> list[dict[str, object]]:
    return [
        {"family": "llama", "strategy": s, "step": step, **{c: 0.1 * step for c in columns}}
        for s in ("uniform", "datc")
        for step in (0, 10)
    ]


@pytest.mark.parametrize("count", [1, 2, len(PROBE_PANELS)])
def test_one_row_of_panels_per_measured_probe(tmp_path: Path, count: int) -> None:
    columns = [column for column, _ in PROBE_PANELS[:count]]
    path = plot_probes(
        tmp_path / "p.png",
        title="t",
        rows=_rows(columns),
        families=["llama"],
        strategies=["uniform", "datc"],
        baseline="uniform",
    )
    assert is_png(path)
    assert _png_height(path) == round(2.5 * count * 110)  # figsize 2.5 in per row, 110 dpi


def test_a_probe_that_is_nan_everywhere_gets_no_panel(tmp_path: Path) -> None:
    rows = _rows(["probe_credit_corr"])
    for r in rows:
        r["probe_oracle_credit_corr"] = float("nan")
    path = plot_probes(
        tmp_path / "p.png", title="t", rows=rows, families=["llama"], strategies=["datc"]
    )
    assert _png_height(path) == round(2.5 * 110)


def test_a_long_title_and_ten_long_labels_stay_inside_the_curve_figure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    drawn = _keep_drawn(monkeypatch)
    strategies = [f"strategy_with_a_long_name_{i}" for i in range(10)]
    rows = [
        {
            "family": "llama",
            "strategy": s,
            "seed": seed,
            "step": step,
            "reward_mean": 0.1 * step,
            "eval_reward_sampled": 0.1 * step,
        }
        for s in strategies
        for seed in (0, 1)
        for step in (0, 1, 2)
    ]
    title = "10. A setting whose name runs on: " + "words of its description " * 6
    figures.plot_curves(
        tmp_path / "c.png", title=title, rows=rows, families=["llama"], strategies=strategies
    )
    (fig,) = drawn
    _assert_legend_and_title_inside(fig)


def test_thirteen_curves_of_a_measured_sweep_keep_their_legend_inside_the_figure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fidelity report's sweep: 13 strategies, labels up to 18 characters."""
    drawn = _keep_drawn(monkeypatch)
    sweep = Sweep(
        kind="length_sweep",
        param="rm_corr",
        settings=("binary", "proxy_10", "proxy_05", "sweep_96"),
        values=(0.668, 0.746, 0.887, 0.970),
        name="fidelity_length",
        spans=((0.411, 0.890), (0.721, 0.768), (0.859, 0.907), (0.953, 0.993)),
    )
    diff = Interval(mean=0.1, low=-0.1, high=0.3, n=12)
    labels = [f"red_matched_lr1e-{i}" for i in range(13)]
    table = SweepTable(
        sweep=sweep,
        baseline="GRPO",
        metric_label="span product (exact rule)",
        baseline_means=(0.57, 0.57, 0.57, 0.57),
        curves=tuple(SweepCurve(label, (diff,) * 4) for label in labels),
        rows=("uniform_lr1e-3",) * 4,
        picked=True,
    )
    figures.plot_sweep(Path("unused.png"), table)
    (fig,) = drawn
    _assert_legend_and_title_inside(fig)


def _keep_drawn(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The figures the plot functions would save, kept open instead."""
    drawn: list[Any] = []

    def keep(fig: Any, path: Path) -> Path:
        drawn.append(fig)
        return path

    monkeypatch.setattr(figures, "_save", keep)
    return drawn


def _assert_legend_and_title_inside(fig: Any) -> None:
    fig.canvas.draw()
    inside = fig.bbox
    for artist in (fig.legends[0], fig._suptitle):
        box = artist.get_window_extent()
        assert inside.x0 <= box.x0 and box.x1 <= inside.x1, (artist, box, inside)
        assert inside.y0 <= box.y0 and box.y1 <= inside.y1, (artist, box, inside)
    figures.pyplot().close(fig)
