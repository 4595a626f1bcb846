"""Whether a callable takes a keyword argument: one rule for every adapter."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any


def accepts_keyword(fn: Callable[..., Any], name: str, *, via_var_keyword: bool = False) -> bool:
    """True when ``fn`` has a parameter ``name`` that can be passed by keyword.

    ``via_var_keyword``: also True when ``fn`` takes ``**kwargs`` (the caller then trusts
    ``fn`` to accept or ignore ``name``). A callable without a readable signature (some
    builtins) takes no keyword.
    """
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        (p.name == name and p.kind is not p.POSITIONAL_ONLY)
        or (via_var_keyword and p.kind is p.VAR_KEYWORD)
        for p in params
    )
