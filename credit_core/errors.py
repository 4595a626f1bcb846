"""credit_core's exception (``CreditError``) and the one reader of pydantic validation errors.

``CreditError`` is what every credit_core API raises on bad input. ``FieldError`` is raised
by a pydantic validator (of any package) to blame a sub-field. ``validation_messages``
turns a pydantic ``ValidationError`` into one ``FieldProblem`` per failed check (dotted
field, what is wrong, the value given); every package of the project prints its config
errors from it, each with its own header.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

#: The start of the message of an unknown key (the allowed keys follow in parentheses).
UNKNOWN_KEY = "unknown key"
#: Longest rendering of an offending input in a message; longer ones are cut with "...".
MAX_INPUT_CHARS = 80


class CreditError(ValueError):
    """Bad input to a credit-assignment API: wrong shape, dtype, value, name or plugin.

    Messages always name the offending field, tensor, strategy or plugin and say what
    was expected.
    """


class FieldError(ValueError):
    """Raised inside a pydantic validator to blame ``field`` (dotted, relative to the model
    being validated) rather than the model as a whole; ``validation_messages`` reports it
    under that field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


ProblemKind = Literal["unknown", "missing", "invalid", "raised"]


@dataclass(frozen=True)
class FieldProblem:
    """One failed check of a validation.

    - ``field``: dotted location ("" when the whole object is at fault).
    - ``message``: what is wrong and what was expected, with the value given when useful.
    - ``kind``: ``unknown`` key (``allowed`` then lists the keys the model accepts),
      ``missing`` required key, ``invalid`` value, or ``raised``: a validator raised a
      ``CreditError``, whose message (which names its own field) is ``message``.
    """

    field: str
    message: str
    kind: ProblemKind = "invalid"
    allowed: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


def validation_messages(
    exc: ValidationError, model: type[BaseModel] | None = None
) -> list[FieldProblem]:
    """The problems of ``exc``, one per pydantic error, in pydantic's order.

    A ``FieldError`` raised by a validator extends the location by its ``field``; a
    ``CreditError`` keeps its own message (kind ``raised``). An unknown key lists the keys
    allowed at its place when ``model`` (the model validated) is given.
    """
    problems = []
    for err in exc.errors():
        loc = [str(part) for part in err["loc"]]
        inner = err.get("ctx", {}).get("error")
        if isinstance(inner, FieldError):
            problems.append(FieldProblem(".".join([*loc, inner.field]), inner.message))
        elif isinstance(inner, CreditError):
            problems.append(FieldProblem(".".join(loc), str(inner), "raised"))
        elif err["type"] == "extra_forbidden":
            allowed = tuple(allowed_keys(model, err["loc"][:-1]) or ()) if model else ()
            hint = f" (allowed keys: {', '.join(allowed)})" if allowed else ""
            problems.append(FieldProblem(".".join(loc), UNKNOWN_KEY + hint, "unknown", allowed))
        elif err["type"] == "missing":
            problems.append(FieldProblem(".".join(loc), "required key is missing", "missing"))
        else:
            message = err["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
            if "input" in err and err["type"] not in ("value_error", "assertion_error"):
                message += f" (got {_short_repr(err['input'])})"
            problems.append(FieldProblem(".".join(loc), message))
    return problems


def allowed_keys(model: type[BaseModel], loc: Sequence[str | int]) -> list[str] | None:
    """The sorted field names of the model found at ``loc`` inside ``model`` (stepping
    through optional fields, lists and dicts of models); None when there is no model there."""
    current: Any = model
    for part in loc:
        current = _model_in(current)
        if current is None:
            return None
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(part) if isinstance(part, str) else None
            if field is None:
                return None
            current = field.annotation
        else:  # a container: this part is a key or an index
            current = current[1]
    found = _model_in(current)
    if isinstance(found, type) and issubclass(found, BaseModel):
        return sorted(found.model_fields)
    return None


def _model_in(annotation: Any) -> Any:
    """A model class, a ``(container, item annotation)`` pair, or None, for ``annotation``
    with ``X | None`` and other unions reduced to their first model or container member."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        members = [_model_in(arg) for arg in args]
        return next((m for m in members if m is not None), None)
    if isinstance(origin, type) and issubclass(origin, Mapping) and len(args) == 2:
        return (origin, args[1])
    if isinstance(origin, type) and issubclass(origin, Sequence) and args:
        return (origin, args[0])
    return None


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= MAX_INPUT_CHARS else text[: MAX_INPUT_CHARS - 3] + "..."
