"""The credit keys as frameworks give them (``backends.common.config_values``): names, mappings and
JSON strings parsed; every problem named by the key the user wrote."""

from __future__ import annotations

import pytest

from backends.common.config_values import parse_credit, parse_direction
from credit_core import CreditError


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
