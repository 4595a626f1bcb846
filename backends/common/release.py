"""The framework release a backend supports, checked without importing the framework.

Each backend subclasses or wraps internals of its framework that change between releases,
so it accepts exactly one release series (``Release``) and refuses anything else at
start-up with one ``CreditError`` naming the version found and the one supported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import metadata

from credit_core import CreditError

_SERIES = re.compile(r"^(\d+)\.(\d+)(?:\.|$|[a-z+])")


def installed_version(distribution: str) -> str | None:
    """The installed ``distribution``'s version string, or None if it is not installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class Release:
    """A supported release series: ``name`` (as people write it), ``series`` (major,
    minor), the ``tested`` version, how to ``install`` it and ``why`` no other one works."""

    name: str
    series: tuple[int, int]
    tested: str
    install: str
    why: str

    @property
    def text(self) -> str:
        """``"0.11.x (tested with 0.11.2)"``."""
        return f"{self.series[0]}.{self.series[1]}.x (tested with {self.tested})"

    def check(self, found: str | None) -> str:
        """``found`` if it is in the series; else ``CreditError`` naming it (None: not
        installed) and the supported series."""
        if found is None:
            raise CreditError(
                f"{self.name} is not installed; the token-credit {self.name} backend supports "
                f"{self.name} {self.text}: {self.install}"
            )
        match = _SERIES.match(found)
        if match is None or (int(match.group(1)), int(match.group(2))) != self.series:
            raise CreditError(
                f"unsupported {self.name} version {found}: the token-credit {self.name} backend "
                f"supports {self.name} {self.text} only ({self.why}); {self.install}"
            )
        return found
