"""The install resolves: every extra is bounded above, and the pins of constraints.txt (the
CI environment) satisfy every range the project declares for a pinned package."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS: dict[str, list[str]] = PROJECT["optional-dependencies"]


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            requirement = Requirement(line)
            (spec,) = requirement.specifier
            assert spec.operator == "==", f"constraints.txt: {line!r} is not a pin"
            pins[canonicalize_name(requirement.name)] = spec.version
    return pins


def _external(extra: str) -> list[Requirement]:
    return [
        Requirement(text) for text in EXTRAS[extra] if not text.startswith(PROJECT["name"] + "[")
    ]


@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_every_requirement_of_an_extra_is_bounded_above(extra: str) -> None:
    for requirement in _external(extra):
        operators = {spec.operator for spec in requirement.specifier}
        assert operators & {"<", "<=", "==", "~="}, (
            f"extra {extra!r}: {requirement} has no upper bound"
        )


@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_the_pins_satisfy_every_range_of_an_extra(extra: str) -> None:
    pins = _pins()
    for requirement in _external(extra):
        pin = pins.get(canonicalize_name(requirement.name))
        if pin is not None:
            assert requirement.specifier.contains(pin, prereleases=True), (
                f"extra {extra!r}: {requirement} excludes constraints.txt's {pin}"
            )


def test_the_library_keeps_torch_unbounded_above() -> None:
    (torch,) = [Requirement(t) for t in PROJECT["dependencies"] if t.startswith("torch")]
    assert str(torch.specifier) == ">=2.4"


def test_constraints_txt_names_a_document_that_exists() -> None:
    first = (ROOT / "constraints.txt").read_text().splitlines()[0]
    named = [word for word in (w.strip("().;,") for w in first.split()) if word.endswith(".md")]
    assert named, f"constraints.txt's first line names no document: {first!r}"
    for path in named:
        assert (ROOT / path).is_file(), f"constraints.txt names {path}, which does not exist"
