"""``validation_messages``: one readable problem per failed pydantic check, for every package."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from credit_core.errors import (
    MAX_INPUT_CHARS,
    CreditError,
    FieldError,
    FieldProblem,
    allowed_keys,
    validation_messages,
)


class Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")

    size: int = 1
    name: str = "x"

    @model_validator(mode="after")
    def _checks(self) -> Inner:
        if self.name == "field":
            raise FieldError("name.part", "blamed on a sub-field")
        if self.name == "credit":
            raise CreditError("strategy 'datc': parameter 'beta': says it all")
        return self


class Outer(BaseModel):
    model_config = ConfigDict(extra="forbid")

    required: int
    inner: Inner | None = None
    by_name: dict[str, Inner] = {}
    listed: list[Inner] = []


def problems(data: dict[str, Any]) -> list[FieldProblem]:
    with pytest.raises(ValidationError) as info:
        Outer.model_validate({"required": 1, **data})
    return validation_messages(info.value, Outer)


def test_an_unknown_key_lists_the_keys_allowed_at_its_place() -> None:
    allowed = ("name", "size")
    for data, field in [
        ({"inner": {"sise": 2}}, "inner.sise"),
        ({"by_name": {"a": {"sise": 2}}}, "by_name.a.sise"),
        ({"listed": [{}, {"sise": 2}]}, "listed.1.sise"),
    ]:
        [problem] = problems(data)
        assert problem == FieldProblem(
            field, "unknown key (allowed keys: name, size)", "unknown", allowed
        )
    [top] = problems({"extra": 1})
    assert str(top) == ("extra: unknown key (allowed keys: by_name, inner, listed, required)")


def test_missing_keys_and_bad_values_name_the_field_and_the_input() -> None:
    with pytest.raises(ValidationError) as info:
        Outer.model_validate({"inner": {"size": "big"}})
    assert [str(p) for p in validation_messages(info.value, Outer)] == [
        "required: required key is missing",
        "inner.size: Input should be a valid integer, unable to parse string as an integer "
        "(got 'big')",
    ]
    assert validation_messages(info.value, Outer)[0].kind == "missing"


def test_validator_errors_are_unwrapped() -> None:
    [field_error] = problems({"inner": {"name": "field"}})
    assert str(field_error) == "inner.name.part: blamed on a sub-field"
    [credit_error] = problems({"inner": {"name": "credit"}})
    assert credit_error.kind == "raised"
    assert credit_error.message == "strategy 'datc': parameter 'beta': says it all"


def test_long_inputs_are_cut() -> None:
    value = "9" * 500 + "x"
    [problem] = problems({"inner": {"size": value}})
    assert problem.message.endswith(f"(got {repr(value)[: MAX_INPUT_CHARS - 3]}...)")


def test_allowed_keys_without_a_model_at_the_place() -> None:
    assert allowed_keys(Outer, ["required"]) is None
    assert allowed_keys(Outer, ["nope"]) is None
    assert allowed_keys(Outer, []) == ["by_name", "inner", "listed", "required"]
