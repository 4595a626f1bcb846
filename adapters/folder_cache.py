"""Folders built once and reused: converted models, pretrained policies, trained reward models.

``cached_dir(root, kind, spec, build)`` returns ``root/kind/<hash of spec>``; when that folder
does not exist yet, ``build(tmp)`` fills a temporary sibling folder which is then renamed
into place (atomic on POSIX), so an interrupted build never leaves a folder that looks
complete, and two processes building the same folder both end up with one whole copy.
``spec.json`` inside records what was built.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["SPEC_FILE", "cached_dir", "spec_hash"]

SPEC_FILE = "spec.json"


def spec_hash(spec: Mapping[str, Any]) -> str:
    """A short stable hash of a JSON-serializable ``spec`` (key order does not matter)."""
    text = json.dumps(spec, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def cached_dir(
    root: str | Path, kind: str, spec: Mapping[str, Any], build: Callable[[Path], None]
) -> Path:
    """``root/kind/<hash>``, built by ``build(folder)`` on first use (see module docstring)."""
    final = Path(root) / kind / spec_hash(spec)
    if (final / SPEC_FILE).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        build(tmp)
        (tmp / SPEC_FILE).write_text(json.dumps(spec, sort_keys=True, indent=1, default=str))
        try:
            os.replace(tmp, final)
        except OSError:
            if not (final / SPEC_FILE).is_file():  # a half-made folder: not ours to keep
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final
