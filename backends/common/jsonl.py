"""Append-only JSONL record files (metrics, credit samples): read them back, and cut them at a
step when a run resumes from an earlier checkpoint."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Every record of a metrics file, in order.

    A last line that does not parse is a record cut short (the process was killed while
    writing it): it is left out. A bad line before it raises ``ValueError`` naming it.
    """
    with open(path, encoding="utf-8", errors="replace") as fh:
        lines = [(n, line) for n, line in enumerate(fh, start=1) if line.strip()]
    records = []
    for i, (number, line) in enumerate(lines):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if i == len(lines) - 1:
                log.warning("%s: line %d is cut short (%s); left out", path, number, exc)
                break
            raise ValueError(f"{path}: line {number} is not a JSON record ({exc})") from None
    return records


def truncate_jsonl(path: str | Path, last_step: int) -> None:
    """Keep only (complete) records with ``step <= last_step`` (atomically rewritten)."""
    file = Path(path)
    if not file.exists():
        return
    kept = [r for r in read_jsonl(file) if int(r["step"]) <= last_step]
    tmp = file.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
    os.replace(tmp, file)
