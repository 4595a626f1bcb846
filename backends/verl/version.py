"""Which verl release this backend supports, checked without importing verl.

The backend subclasses verl's FSDP engine (``prepare_model_outputs``) and its V1 PPO trainer
(``_compute_old_log_prob``, ``_compute_advantage``), internals that change between releases,
so it accepts exactly one release series and refuses anything else at start-up.
"""

from __future__ import annotations

import re
from importlib import metadata

from credit_core import CreditError

#: The supported release series: verl 0.9.x.
SUPPORTED_SERIES: tuple[int, int] = (0, 9)
SUPPORTED_TEXT = "0.9.x (tested with 0.9.1)"


def installed_verl_version() -> str | None:
    """The installed verl distribution's version string, or None if it is not installed."""
    try:
        return metadata.version("verl")
    except metadata.PackageNotFoundError:
        return None


def check_verl_version(version: str | None = None) -> str:
    """Return ``version`` (default: the installed one) if it is supported, else raise
    ``CreditError`` naming the found and the supported versions."""
    found = installed_verl_version() if version is None else version
    if found is None:
        raise CreditError(
            f"verl is not installed; the token-credit verl backend supports verl {SUPPORTED_TEXT}"
            ": build its environment with `make verl` (.venv-verl, docs/verl.md)"
        )
    match = re.match(r"^(\d+)\.(\d+)(?:\.|$|[a-z+])", found)
    if match is None or (int(match.group(1)), int(match.group(2))) != SUPPORTED_SERIES:
        raise CreditError(
            f"unsupported verl version {found}: the token-credit verl backend supports verl "
            f"{SUPPORTED_TEXT} only (it subclasses engine and trainer internals that change "
            "between releases); build .venv-verl with `make verl`"
        )
    return found
