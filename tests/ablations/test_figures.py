"""The credit-probe figure (``ablations.figures.plot_probes``): one row of panels per probe
that the run measured, none for a probe that was off (e.g. the oracle without
``probes.oracle_k``)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from ablations.figures import PROBE_PANELS, is_png, plot_probes


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
