"""The credit keys as frameworks give them (``backends.common.config_values``): names, mappings and
JSON strings parsed; every problem named by the key the user wrote."""

from __future__ import annotations

import pytest

from backends.common.config_values import (
    CreditSection,
    SectionKeys,
    parse_credit,
    parse_direction,
    parse_section,
)
from credit_core import CreditError
from credit_core.policy_stats import DEFAULT_CHUNK_SIZE


def test_a_name_a_mapping_and_a_json_string_are_the_same_credit() -> None:
    expected = parse_credit({"name": "datc", "beta": 2.0}, "credit")
    assert parse_credit('{"name": "datc", "beta": 2.0}', "credit") == expected
    assert parse_credit(None, "algorithm.credit").name == "uniform"
    assert parse_credit("datc_mid", "credit").name == "datc_mid"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (3, r"^algorithm\.credit: expected a strategy name or a mapping with 'name', got int"),
        ("{oops", r"^algorithm\.credit: expected a JSON object, got '\{oops'"),
        ({"name": "nope"}, r"^algorithm\.credit: unknown credit strategy 'nope'"),
    ],
)
def test_a_bad_credit_names_its_key(value: object, message: str) -> None:
    with pytest.raises(CreditError, match=message):
        parse_credit(value, "algorithm.credit")


def test_direction_problems_are_named_under_the_key() -> None:
    assert parse_direction(None, "direction") is None
    cfg = parse_direction('{"kind": "seq_classification", "path": "/m"}', "direction")
    assert cfg is not None and cfg.path == "/m"
    with pytest.raises(CreditError, match=r"^algorithm\.direction\.kind: unknown kind 'nope'"):
        parse_direction({"kind": "nope"}, "algorithm.direction")
    with pytest.raises(CreditError, match=r"algorithm\.direction\.pth: .*allowed keys: .*path"):
        parse_direction({"kind": "seq_classification", "pth": "/m"}, "algorithm.direction")
    with pytest.raises(CreditError, match=r"^direction: expected a mapping with 'kind'"):
        parse_direction([1], "direction")


def test_the_section_holds_the_three_keys_typed() -> None:
    keys = SectionKeys(
        "algorithm.credit", "algorithm.direction", "algorithm.credit_stats_chunk_size"
    )
    section = parse_section("datc", {"kind": "seq_classification", "path": "/m"}, 128, keys)
    assert section == CreditSection(
        parse_credit("datc", "credit"),
        parse_direction({"kind": "seq_classification", "path": "/m"}, "d"),
        128,
    )
    assert parse_section(None, None, None).chunk_size == DEFAULT_CHUNK_SIZE


@pytest.mark.parametrize("value", [0, -1, True, 2.0, "8"])
def test_a_bad_chunk_size_names_its_key(value: object) -> None:
    keys = SectionKeys(chunk_size="--credit.stats_chunk_size")
    with pytest.raises(CreditError, match=r"^--credit\.stats_chunk_size: expected an integer >= 1"):
        parse_section("uniform", None, value, keys)


def test_a_gate_is_refused_by_a_backend_that_does_not_apply_it() -> None:
    """A backend that parses its credit here and does not apply ``credit.gate`` refuses the
    key, named under the backend's own key, not dropped; one that does (``gate=True``, verl's
    ``parse_section``) keeps it."""
    value = {"name": "datc", "gate": {"agreement": [0.0, 0.5]}}
    with pytest.raises(CreditError, match=r"^algorithm\.credit\.gate: this backend does not"):
        parse_credit(value, "algorithm.credit")
    assert parse_credit(value, "credit", gate=True).gate is not None
    assert parse_credit({"name": "datc"}, "credit").gate is None
    assert parse_section(value, None, None, gate=True).credit.gate is not None
