"""Which verl release this backend supports, checked without importing verl.

The backend subclasses verl's FSDP engine (``prepare_model_outputs``) and its V1 PPO trainer
(``_compute_old_log_prob``, ``_compute_advantage``), internals that change between releases,
so it accepts exactly one release series and refuses anything else at start-up.
"""

from __future__ import annotations

from backends.common.release import Release, installed_version

#: The supported release series.
RELEASE = Release(
    name="verl",
    series=(0, 9),
    tested="0.9.1",
    install="build .venv-verl with `make verl` (docs/verl.md)",
    why="it subclasses engine and trainer internals that change between releases",
)
SUPPORTED_SERIES: tuple[int, int] = RELEASE.series
SUPPORTED_TEXT = RELEASE.text


def installed_verl_version() -> str | None:
    """The installed verl distribution's version string, or None if not installed."""
    return installed_version("verl")


def check_verl_version(version: str | None = None) -> str:
    """Return ``version`` (default: the installed one) if it is supported, else raise
    ``CreditError`` naming the found and the supported versions."""
    return RELEASE.check(installed_verl_version() if version is None else version)
