"""The errors of the torch backend's configuration, and how a failed validation is printed.

``ConfigError``: a config (file, ``--set`` override, prompt file, run folder) that cannot be
used. ``FieldError`` (from ``credit_core.errors``): raised by a validator to blame a
sub-field. ``format_config_errors`` prints a pydantic ``ValidationError`` of a config as one
line per problem, each with where the value came from (``file.yaml:LINE`` or ``--set``).
This module imports no other module of the backend, so every one of them can import it.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ValidationError

from credit_core.errors import UNKNOWN_KEY, FieldError, validation_messages

__all__ = ["ConfigError", "FieldError", "format_config_errors"]


class ConfigError(ValueError):
    """A config that cannot be used; the message names every offending key and its source."""


def format_config_errors(
    exc: ValidationError,
    model: type[BaseModel],
    source: str,
    lines: Mapping[tuple[str, ...], int] | None = None,
    overridden: Mapping[tuple[str, ...], str] | None = None,
    *,
    what: str = "config",
    unknown_key: str = "unknown key",
) -> str:
    """``invalid <what> <source>:`` and one line per problem of ``exc`` (from validating
    ``model``): ``  dotted.key: message  [where]``.

    ``where`` is the ``--set`` argument that set the key (``overridden``: key path -> the
    argument), else ``source:LINE`` of the key or its closest parent found in ``lines``
    (key path -> 1-based line), plus the ``--set`` arguments below the key. An unknown key
    reads ``<unknown_key> (allowed keys: ...)``.
    """
    lines = lines or {}
    overridden = overridden or {}
    out = []
    for problem in validation_messages(exc, model):
        loc = tuple(problem.field.split(".")) if problem.field else ()
        where = next(
            (
                f"--set {overridden[loc[:i]]}"
                for i in range(len(loc), 0, -1)
                if loc[:i] in overridden
            ),
            None,
        )
        if where is None:
            known = next((loc[:i] for i in range(len(loc), 0, -1) if loc[:i] in lines), None)
            where = f"{source}:{lines[known]}" if known else source
            below = [f"--set {t}" for k, t in overridden.items() if k[: len(loc)] == loc]
            where = ", ".join([where, *below])
        message = problem.message
        if problem.kind == "unknown":
            message = unknown_key + message.removeprefix(UNKNOWN_KEY)
        out.append(f"  {problem.field or '<root>'}: {message}  [{where}]")
    return f"invalid {what} {source}:\n" + "\n".join(out)
