"""Which OpenRLHF releases this integration supports, checked without importing OpenRLHF.

The integration relies on OpenRLHF internals that change between minor releases (the
``Experience`` layout, ``RemoteExperienceMaker.compute_advantages_and_returns``, the trainer
actor's ``experience_maker`` attribute, ``RayActorGroup.async_run_method_batch``), so it
accepts exactly one minor series and refuses anything else at start-up.
"""

from __future__ import annotations

from backends.common.release import Release, installed_version

#: The supported release series.
RELEASE = Release(
    name="OpenRLHF",
    series=(0, 11),
    tested="0.11.2",
    install="install 'openrlhf>=0.11,<0.12'",
    why="it patches OpenRLHF internals that change between minor releases",
)
SUPPORTED_SERIES: tuple[int, int] = RELEASE.series
SUPPORTED_TEXT = RELEASE.text


def installed_openrlhf_version() -> str | None:
    """The installed OpenRLHF distribution's version string, or None if not installed."""
    return installed_version("openrlhf")


def check_openrlhf_version(version: str | None = None) -> str:
    """Return ``version`` (default: the installed one) if it is supported, else raise
    ``CreditError`` naming the found and the supported versions."""
    return RELEASE.check(installed_openrlhf_version() if version is None else version)
