"""Which code produced each run: the commit of the checkout, and the report's account of it.

A run records ``CodeVersion.label`` of the process that trained it (``result.json`` key
``code``, results.csv column ``commit``): the full ``git rev-parse HEAD`` of the checkout
that holds this package, with ``-dirty`` appended when tracked files under
``CODE_DIRS`` differ from that commit (``git status --porcelain``), or ``unknown`` where git
or the repository is unavailable, and for the rows of results written before the column
existed. The version is taken once per process (``code_version``), not per run.

``provenance_markdown`` is the report's "Provenance" section: each distinct version with
its number of runs and the (setting, strategy) groups it produced; unknown and dirty
versions are flagged, since their runs cannot be traced to a commit.
"""

from __future__ import annotations

import functools
import subprocess
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The folders whose tracked files determine what a run computes.
CODE_DIRS: tuple[str, ...] = ("credit_core", "adapters", "backends", "ablations")
UNKNOWN = "unknown"
DIRTY_SUFFIX = "-dirty"
#: The results.csv column (and ``result.json`` key ``code``) holding a run's version label.
COMMIT_COLUMN = "commit"
_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class CodeVersion:
    """A commit (full hash, or ``UNKNOWN``) and whether the code folders differed from it."""

    commit: str
    dirty: bool = False

    @property
    def label(self) -> str:
        """``<hash>``, ``<hash>-dirty`` or ``unknown``: the stored form."""
        if self.commit == UNKNOWN:
            return UNKNOWN
        return self.commit + (DIRTY_SUFFIX if self.dirty else "")

    @property
    def short(self) -> str:
        """The label with the hash cut to 7 characters."""
        if self.commit == UNKNOWN:
            return UNKNOWN
        return self.commit[:7] + (DIRTY_SUFFIX if self.dirty else "")

    @property
    def traceable(self) -> bool:
        """Whether the runs can be reproduced from the commit alone (known and clean)."""
        return self.commit != UNKNOWN and not self.dirty

    @staticmethod
    def parse(label: str | None) -> CodeVersion:
        """The version of a stored label; None (an older result without one) is unknown."""
        if not label or label == UNKNOWN:
            return CodeVersion(UNKNOWN)
        if label.endswith(DIRTY_SUFFIX):
            return CodeVersion(label.removesuffix(DIRTY_SUFFIX), dirty=True)
        return CodeVersion(label)


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, check=True, timeout=30
    )
    return done.stdout


def read_code_version(root: Path = _ROOT) -> CodeVersion:
    """The version of the checkout at ``root`` (``UNKNOWN`` when git cannot tell)."""
    try:
        commit = _git(root, "rev-parse", "HEAD").strip()
        status = _git(root, "status", "--porcelain", "--untracked-files=no", "--", *CODE_DIRS)
    except (OSError, subprocess.SubprocessError):
        return CodeVersion(UNKNOWN)
    return CodeVersion(commit, dirty=bool(status.strip())) if commit else CodeVersion(UNKNOWN)


@functools.cache
def code_version() -> CodeVersion:
    """This process's code version, read once (``read_code_version`` of this checkout)."""
    return read_code_version()


def result_version(result: dict[str, Any]) -> CodeVersion:
    """The version recorded in a run's ``result.json`` (unknown in older results)."""
    return CodeVersion.parse(result.get("code"))


def row_version(row: dict[str, Any]) -> CodeVersion:
    """The version of a results.csv row (unknown in rows written before the column)."""
    return CodeVersion.parse(row.get(COMMIT_COLUMN))


def provenance_markdown(rows: Iterable[dict[str, Any]], current: CodeVersion) -> str:
    """The report's "Provenance" section from results.csv ``rows``: per version (in order
    of first appearance), its runs and (setting, strategy) groups; ``current`` is the
    version that writes the report."""
    runs: dict[CodeVersion, dict[tuple[str, str, str, int], None]] = defaultdict(dict)
    groups: dict[CodeVersion, dict[tuple[str, str], None]] = defaultdict(dict)
    for row in rows:
        version = row_version(row)
        runs[version][(row["setting"], row["family"], row["strategy"], int(row["seed"]))] = None
        groups[version][(row["setting"], row["strategy"])] = None
    lines = [
        "## Provenance",
        "",
        "The code version that trained each run (`commit` column of results.csv: the "
        f"checkout's commit, `-dirty` when tracked files under {', '.join(CODE_DIRS)} differed "
        "from it). Rows from an unknown or dirty version are flagged: no commit reproduces "
        "them. Rows carried over from another commit can be rerun and compared with "
        "`python -m ablations check CONFIG --sample N` (docs/results/README.md). "
        f"This report was written by `{current.short}`.",
        "",
        "| code version | runs | (setting, strategy) groups | note |",
        "|---|---|---|---|",
    ]
    for version, found in runs.items():
        flag = "" if version.traceable else "**flagged: " + _why(version) + "**"
        if version.traceable and version != current:
            flag = "another commit than the report's"
        named = ", ".join(f"{s}/`{st}`" for s, st in groups[version])
        lines.append(f"| `{version.short}` | {len(found)} | {named} | {flag} |")
    return "\n".join(lines)


def _why(version: CodeVersion) -> str:
    return "unknown commit" if version.commit == UNKNOWN else "uncommitted changes"
