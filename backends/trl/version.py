"""Which TRL release this integration supports, checked without importing TRL.

The integration subclasses ``trl.GRPOTrainer`` and relies on internals that change between
releases (``_generate_and_score_completions``' output dict, the order of the old-policy and
reference forwards in it, ``_compute_loss`` reading ``inputs["advantages"]`` after the loss
forward, the fused LM head's backbone call), so it accepts exactly one release series and
refuses anything else at start-up.
"""

from __future__ import annotations

from backends.common.release import Release, installed_version

#: The supported release series.
RELEASE = Release(
    name="TRL",
    series=(1, 16),
    tested="1.16.0",
    install="install 'trl>=1.16,<1.17'",
    why="it overrides GRPOTrainer internals that change between releases",
)
SUPPORTED_SERIES: tuple[int, int] = RELEASE.series
SUPPORTED_TEXT = RELEASE.text


def installed_trl_version() -> str | None:
    """The installed TRL distribution's version string, or None if not installed."""
    return installed_version("trl")


def check_trl_version(version: str | None = None) -> str:
    """Return ``version`` (default: the installed one) if it is supported, else raise
    ``CreditError`` naming the found and the supported versions."""
    return RELEASE.check(installed_trl_version() if version is None else version)
