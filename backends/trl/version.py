"""Which TRL release this integration supports, checked without importing TRL.

The integration subclasses ``trl.GRPOTrainer`` and relies on internals that change between
releases (``_generate_and_score_completions``' output dict, the order of the old-policy and
reference forwards in it, ``_compute_loss`` reading ``inputs["advantages"]`` after the loss
forward, the fused LM head's backbone call), so it accepts exactly one release series and
refuses anything else at start-up.
"""

from __future__ import annotations

import re
from importlib import metadata

from credit_core import CreditError

#: The supported release series: TRL 1.16.x.
SUPPORTED_SERIES: tuple[int, int] = (1, 16)
SUPPORTED_TEXT = "1.16.x (tested with 1.16.0)"


def installed_trl_version() -> str | None:
    """The installed TRL distribution's version string, or None if it is not installed."""
    try:
        return metadata.version("trl")
    except metadata.PackageNotFoundError:
        return None


def check_trl_version(version: str | None = None) -> str:
    """Return ``version`` (default: the installed one) if it is supported, else raise.

    Raises ``CreditError`` naming the found and the supported versions when TRL is missing or
    its version is outside ``SUPPORTED_SERIES``.
    """
    found = installed_trl_version() if version is None else version
    if found is None:
        raise CreditError(
            f"TRL is not installed; the token-credit integration supports TRL {SUPPORTED_TEXT}: "
            "pip install 'trl>=1.16,<1.17'"
        )
    match = re.match(r"^(\d+)\.(\d+)(?:\.|$|[a-z+])", found)
    if match is None or (int(match.group(1)), int(match.group(2))) != SUPPORTED_SERIES:
        raise CreditError(
            f"unsupported TRL version {found}: the token-credit integration supports TRL "
            f"{SUPPORTED_TEXT} only (it overrides GRPOTrainer internals that change between "
            "releases); install 'trl>=1.16,<1.17'"
        )
    return found
