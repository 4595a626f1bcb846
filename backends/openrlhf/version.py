"""Which OpenRLHF releases this integration supports, checked without importing OpenRLHF.

The integration relies on OpenRLHF internals that change between minor releases (the
``Experience`` layout, ``RemoteExperienceMaker.compute_advantages_and_returns``, the trainer
actor's ``experience_maker`` attribute, ``RayActorGroup.async_run_method_batch``), so it
accepts exactly one minor series and refuses anything else at start-up.
"""

from __future__ import annotations

import re
from importlib import metadata

from credit_core import CreditError

#: The supported release series: OpenRLHF 0.11.x.
SUPPORTED_SERIES: tuple[int, int] = (0, 11)
SUPPORTED_TEXT = "0.11.x (tested with 0.11.2)"


def installed_openrlhf_version() -> str | None:
    """The installed OpenRLHF distribution's version string, or None if it is not installed."""
    try:
        return metadata.version("openrlhf")
    except metadata.PackageNotFoundError:
        return None


def check_openrlhf_version(version: str | None = None) -> str:
    """Return ``version`` (default: the installed one) if it is supported, else raise.

    Raises ``CreditError`` with the found and the supported versions when OpenRLHF is missing
    or its version is outside ``SUPPORTED_SERIES``.
    """
    found = installed_openrlhf_version() if version is None else version
    if found is None:
        raise CreditError(
            f"OpenRLHF is not installed; the token-credit integration supports OpenRLHF "
            f"{SUPPORTED_TEXT}: pip install 'openrlhf>=0.11,<0.12'"
        )
    match = re.match(r"^(\d+)\.(\d+)(?:\.|$|[a-z+])", found)
    if match is None or (int(match.group(1)), int(match.group(2))) != SUPPORTED_SERIES:
        raise CreditError(
            f"unsupported OpenRLHF version {found}: the token-credit integration supports "
            f"OpenRLHF {SUPPORTED_TEXT} only (it patches OpenRLHF internals that change between "
            "minor releases); install 'openrlhf>=0.11,<0.12'"
        )
    return found
