"""Cached build artifacts (pretrained policies, trained reward models): built once, reused.

``cached_dir(root, kind, spec, build)`` returns ``root/kind/<hash of spec>``; when that folder
does not exist yet, ``build(tmp)`` fills a temporary sibling folder which is then renamed
into place (atomic on POSIX), so an interrupted build never leaves a folder that looks
complete, and two processes building the same artifact both end up with one whole copy.
``spec.json`` inside records what was built.

``SpecModel`` is the base of the parameter models whose dump is part of a cache key or a
run's fingerprint: a field at None is left out of its dump, so an optional knob added with
default None keeps every key and fingerprint made before it.
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

from pydantic import BaseModel, SerializerFunctionWrapHandler, model_serializer

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


class SpecModel(BaseModel):
    """A parameter model whose dump (``model_dump``, also of it nested in another) leaves out
    every field whose value is None (module docstring)."""

    @model_serializer(mode="wrap")
    def _without_unset_knobs(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if not isinstance(data, dict):
            return data
        return {key: value for key, value in data.items() if value is not None}
