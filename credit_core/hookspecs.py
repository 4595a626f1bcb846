"""pluggy hook specifications: the one extension point of credit_core.

A plugin is any module or object with a ``@hookimpl``-decorated ``credit_core_strategies``
function; register it in-process with ``register_plugin`` or ship it in a package under the
entry-point group ``credit_core.strategies``. The built-in strategies use the same hook.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import pluggy

PROJECT_NAME = "credit_core"
ENTRY_POINT_GROUP = "credit_core.strategies"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

if TYPE_CHECKING:
    from credit_core.strategy import CreditStrategy


@hookspec
def credit_core_strategies() -> Iterable[type[CreditStrategy]]:  # type: ignore[empty-body]
    """Return the strategy classes this plugin provides (subclasses of ``CreditStrategy``)."""
