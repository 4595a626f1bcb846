"""Where the repository and the test tree are, for tests that read files or start processes."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
