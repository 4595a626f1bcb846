"""adapters.folder_cache: a folder is built once, atomically, under the hash of its spec."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adapters.folder_cache import SPEC_FILE, cached_dir, spec_hash


def test_cached_dir_builds_once_and_never_leaves_half_a_folder(tmp_path: Path) -> None:
    calls: list[Path] = []

    def build(folder: Path) -> None:
        calls.append(folder)
        (folder / "x.txt").write_text("built")

    spec = {"b": 2, "a": 1}
    first = cached_dir(tmp_path, "thing", spec, build)
    again = cached_dir(tmp_path, "thing", {"a": 1, "b": 2}, build)
    assert first == again == tmp_path / "thing" / spec_hash(spec) and len(calls) == 1
    assert (first / "x.txt").read_text() == "built"
    assert json.loads((first / SPEC_FILE).read_text()) == spec

    def broken(folder: Path) -> None:
        (folder / "partial").write_text("...")
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError, match="interrupted"):
        cached_dir(tmp_path, "thing", {"other": True}, broken)
    assert sorted(p.name for p in (tmp_path / "thing").iterdir()) == [first.name]
