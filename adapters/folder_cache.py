"""Folders built once and reused: converted models, pretrained policies, trained reward models.

``cached_dir(root, kind, spec, build)`` returns ``root/kind/<hash of spec>``; when that folder
does not exist yet, ``build(tmp)`` fills a temporary sibling folder which is then renamed
into place (atomic on POSIX), so an interrupted build never leaves a folder that looks
complete. A build holds an exclusive lock on the sibling file ``.<hash>.lock`` (``flock``,
released by the kernel when its process dies): a second process that asks for the same
folder meanwhile waits and reads the first one's instead of building it again (two workers
that would each dequantize the same GGUF file, or train the same reward model). The lock
files stay (removing one while another process waits on it would let a third build
beside it). ``spec.json`` inside records what was built.
"""

from __future__ import annotations

import fcntl
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
    with open(final.parent / f".{final.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released on close, or by the kernel on death
        if (final / SPEC_FILE).is_file():  # built by the process we waited for
            return final
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
