"""adapters.folder_cache: a folder is built once, atomically, under the hash of its spec, by
one process while the others wait."""

from __future__ import annotations

import json
import multiprocessing
import time
from pathlib import Path
from typing import Any

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
    left = sorted(p.name for p in (tmp_path / "thing").iterdir() if p.suffix != ".lock")
    assert left == [first.name]


def _build_slowly(root: str, log: str, start: Any, result: Any) -> None:
    """A process's call of ``cached_dir`` once both processes are ready, whose build takes
    a while and logs that it ran; puts the folder it got on ``result``."""

    def build(folder: Path) -> None:
        with open(log, "a") as fh:
            fh.write("built\n")
        time.sleep(1.0)
        (folder / "x.txt").write_text("built")

    start.wait()
    result.put(str(cached_dir(root, "thing", {"a": 1}, build)))


@pytest.mark.slow
def test_a_second_process_waits_for_the_first_build_instead_of_building_again(
    tmp_path: Path,
) -> None:
    log = tmp_path / "builds.log"
    context = multiprocessing.get_context("spawn")
    start, result = context.Barrier(2), context.Queue()
    workers = [
        context.Process(target=_build_slowly, args=(str(tmp_path), str(log), start, result))
        for _ in range(2)
    ]
    for w in workers:
        w.start()
    folders = [result.get(timeout=60) for _ in workers]
    for w in workers:
        w.join(timeout=60)
        assert w.exitcode == 0
    assert folders[0] == folders[1]
    assert log.read_text() == "built\n"  # one build; the other process waited and read it
    assert (Path(folders[0]) / "x.txt").read_text() == "built"
