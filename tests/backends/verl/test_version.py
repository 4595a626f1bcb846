"""The supported verl release, checked without importing verl (runs in both environments:
in .venv, where verl is absent, ``credit-verl`` says how to get it in one message)."""

from __future__ import annotations

import importlib.util

import pytest

from backends.verl.cli import PROG, main
from backends.verl.version import check_verl_version
from credit_core import CreditError


@pytest.mark.parametrize("version", ["0.9.1", "0.9.0", "0.9.2.dev0"])
def test_the_supported_series_is_accepted(version: str) -> None:
    assert check_verl_version(version) == version


@pytest.mark.parametrize("version", ["0.8.2", "0.10.0", "1.0.0", "nightly"])
def test_other_releases_are_refused_naming_both(version: str) -> None:
    with pytest.raises(CreditError, match=rf"unsupported verl version {version}: .* 0\.9\.x"):
        check_verl_version(version)


@pytest.mark.skipif(importlib.util.find_spec("verl") is not None, reason="verl is installed")
def test_without_verl_the_command_says_how_to_get_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["algorithm.credit=datc"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{PROG}: error: verl is not installed") and "make verl" in err
    assert "Traceback" not in err
