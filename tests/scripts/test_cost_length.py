"""scripts/cost_length.py: the table and figure of the signal-phase cost against length
(from given cells; the measurement itself is the script's run), and its argument checks."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "cost_length.py"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cost_length", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["cost_length"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def test_the_table_has_one_row_per_rm_and_length_with_medians_and_peaks(tmp_path: Path) -> None:
    m = _module()
    cells = [
        m.Cell(24, "causal", "uniform", [0.01, 0.03, 0.02], [0.0, 0.02, 0.01], [24.0], 2**20),
        m.Cell(24, "encoder", "uniform", [0.1, 0.3, 0.2], [0.05, 0.07, 0.06], [23.0], None),
        m.Cell(24, "encoder", "red", [1.0, 3.0, 2.0], [0.5, 0.9, 0.7], [25.0], 3 * 2**20),
    ]
    lines = m.table(cells, ["uniform", "red"]).splitlines()
    assert lines[0] == "| RM | length (mean response) | `uniform` | `red` |"
    assert lines[2] == (
        "| encoder | 24 (24) | 0.2000 s [RM 0.0600], n/a | 2.0000 s [RM 0.7000], 3.0 MiB |"
    )
    assert lines[3] == "| causal | 24 (24) | 0.0200 s [RM 0.0100], 1.0 MiB | - |"
    m.figure(cells, ["uniform", "red"], tmp_path / "f.png")
    assert (tmp_path / "f.png").stat().st_size > 0


def test_bad_arguments_stop_before_anything_is_built(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    m = _module()
    out = tmp_path / "out"
    assert m.main(["--strategies", "{name: nope}", "--out", str(out)]) == 2
    assert "unknown credit strategy 'nope'" in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(SystemExit):
        m.main(["--steps", "0"])
