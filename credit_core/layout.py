"""The project's top-level packages, and a check that they are the ones imported.

The ``token-credit`` distribution installs top-level packages named ``credit_core``,
``adapters``, ``backends``, ``benchmarks`` and ``ablations``. ``adapters`` is also the import
name of AdapterHub's PyPI package (``pip install adapters``); with both installed, ``import
adapters`` gives whichever comes first on ``sys.path``. ``check_layout`` finds that out at
import time and says what to do, instead of a later ``ModuleNotFoundError`` about
``adapters.policy``. README.md, "Installing beside other packages", documents it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

#: The distribution's top-level packages besides ``credit_core``.
SIBLINGS: tuple[str, ...] = ("adapters", "backends", "benchmarks", "ablations")


def foreign_packages(names: tuple[str, ...] = SIBLINGS) -> dict[str, str]:
    """Each of ``names`` that imports from somewhere other than the folder holding
    ``credit_core``, mapped to where it imports from. Missing packages are not listed."""
    root = Path(__file__).resolve().parent.parent
    foreign = {}
    for name in names:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            if spec is not None and spec.origin:
                foreign[name] = spec.origin
            continue
        locations = [Path(p).resolve() for p in spec.submodule_search_locations]
        if all(loc.parent != root for loc in locations):
            foreign[name] = ", ".join(map(str, locations))
    return foreign


def check_layout(names: tuple[str, ...] = SIBLINGS) -> None:
    """Raise ``ImportError`` naming every package of ``names`` that another installed
    package shadows, and what to do about it."""
    foreign = foreign_packages(names)
    if foreign:
        where = "; ".join(f"'import {n}' gives {p}" for n, p in sorted(foreign.items()))
        raise ImportError(
            f"token-credit: {where}, not this project's package beside credit_core/. Another "
            "installed distribution uses the same top-level name (AdapterHub's 'adapters' "
            "does). Install token-credit in its own virtual environment, or uninstall the "
            "other one (pip uninstall adapters); see README.md, 'Installing beside other "
            "packages'."
        )
