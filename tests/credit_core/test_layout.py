"""The distribution's top-level packages: a shadowing package is named at import time."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from credit_core.layout import SIBLINGS, foreign_packages
from tests.helpers.paths import REPO


def test_every_sibling_package_of_this_checkout_is_its_own() -> None:
    assert foreign_packages() == {}
    assert set(SIBLINGS) == {"adapters", "backends", "benchmarks", "ablations"}


def _import_with_shadow(tmp_path: Path, statement: str) -> subprocess.CompletedProcess[str]:
    shadow = tmp_path / "adapters"
    shadow.mkdir()
    (shadow / "__init__.py").write_text('"""Stands in for AdapterHub\'s adapters package."""\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    return subprocess.run(
        [sys.executable, "-c", statement], env=env, capture_output=True, text=True, cwd=tmp_path
    )


def test_a_shadowing_adapters_package_stops_the_backends_with_a_message(tmp_path: Path) -> None:
    proc = _import_with_shadow(tmp_path, "import backends.torch.trainer")
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: token-credit: 'import adapters' gives ")
    assert str(tmp_path / "adapters") in last and "pip uninstall adapters" in last


def test_credit_core_alone_still_imports_beside_a_shadowing_package(tmp_path: Path) -> None:
    proc = _import_with_shadow(tmp_path, "import credit_core; print(credit_core.list_strategies())")
    assert proc.returncode == 0, proc.stderr
    assert "datc" in proc.stdout
