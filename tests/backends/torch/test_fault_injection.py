"""Fault injection: whatever happened to a run folder, ``--resume`` finishes the run exactly
as an uninterrupted run would, or refuses with a message that says what to do, and nothing
in the folder runs code.

Every case damages a copy of one uninterrupted reference run (so each copy is also a moved
run folder) and resumes it in this process.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from backends.common.errors import ConfigError
from backends.common.jsonl import read_jsonl
from backends.torch.config import load_config
from backends.torch.trainer import RunResult, train
from tests.helpers.torch_tiny import RESUMABLE, comparable, tiny_config

pytestmark = pytest.mark.usefixtures("single_torch_thread")

UPDATES: dict[str, Any] = {**RESUMABLE, "checkpoint": {"interval": 1, "keep_last": 3}}
SHARD = "state/shard-00001-model-00001-of-00001.safetensors"
CHECKPOINT_FILES = [
    "manifest.json",
    "train_state.json",
    "rank0.safetensors",
    SHARD,
    "model.safetensors",
    "config.json",
]
LOGGER = "backends.torch.checkpoint"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    """The uninterrupted run every case must reproduce."""
    return train(tiny_config(tmp_path_factory.mktemp("reference") / "run", **UPDATES))


def copy_of(reference: RunResult, tmp_path: Path) -> Path:
    run = tmp_path / "elsewhere" / "run"
    shutil.copytree(reference.run_dir, run)
    return run


def resume(run: Path) -> RunResult:
    return train(tiny_config(run, **UPDATES), resume=True)


def steps_of(result: RunResult) -> list[int]:
    return [int(r["step"]) for r in result.history if "reward/mean" in r]


def assert_same_as_reference(run: Path, reference: RunResult) -> None:
    """Same metrics file (no step missing or twice) and bit-identical final weights."""
    got = [comparable(r) for r in read_jsonl(run / "metrics.jsonl")]
    assert got == [comparable(r) for r in reference.history]
    a = load_file(str(run / "checkpoints" / "step_000003" / "model.safetensors"))
    b = load_file(str(reference.run_dir / "checkpoints" / "step_000003" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def rewrite_manifest(folder: Path, name: str) -> None:
    """What an attacker who edits the manifest too does: ``name`` listed with its hash."""
    manifest = json.loads((folder / "manifest.json").read_text())
    data = (folder / name).read_bytes()
    manifest["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (folder / "manifest.json").write_text(json.dumps(manifest))


# ------------------------------------------------------------------- damaged checkpoints


def damaged(data: bytes, damage: str, name: str) -> bytes:
    if damage == "wrong_size":
        return data[: len(data) // 2]
    if damage == "same_size_garbage":
        return bytes(len(data))
    # one changed byte that leaves the file well-formed: only its hash tells
    if name.endswith(".json"):
        at = max(data.rfind(digit) for digit in b"123456789")
        return data[:at] + b"0" + data[at + 1 :]
    return data[:-1] + bytes([data[-1] ^ 1])  # the last tensor's last byte


@pytest.mark.parametrize(
    ("name", "damage"),
    [
        *((name, "wrong_size") for name in CHECKPOINT_FILES),
        *((name, "same_size_garbage") for name in CHECKPOINT_FILES),
        *((name, "one_changed_byte") for name in CHECKPOINT_FILES[1:]),  # not the manifest
    ],
)
def test_a_damaged_newest_checkpoint_is_named_moved_aside_and_the_run_finishes(
    tmp_path: Path,
    reference: RunResult,
    caplog: pytest.LogCaptureFixture,
    name: str,
    damage: str,
) -> None:
    run = copy_of(reference, tmp_path)
    newest = run / "checkpoints" / "step_000003"
    file = newest / name
    data = file.read_bytes()
    file.write_bytes(damaged(data, damage, name))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        resumed = resume(run)
    assert str(file) in caplog.text and "moved aside to step_000003.corrupt-1" in caplog.text
    assert (run / "checkpoints" / "step_000003.corrupt-1" / name).read_bytes() != data
    assert steps_of(resumed) == [3]  # from the intact step-2 checkpoint
    assert_same_as_reference(run, reference)


def test_after_a_fallback_every_later_resume_works_too(
    tmp_path: Path, reference: RunResult
) -> None:
    run = copy_of(reference, tmp_path)
    (run / "checkpoints" / "step_000003" / "manifest.json").write_text("{")
    assert steps_of(resume(run)) == [3]
    assert steps_of(resume(run)) == []  # step_000003 was written again: nothing left to do
    assert_same_as_reference(run, reference)


# ---------------------------------------------------------------------- crafted pickles


class RunsCode:
    """Unpickling it runs a shell command that creates ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def write_payload(path: Path, marker: Path) -> None:
    """As ``torch.save`` would (``*.pt``), or as a bare pickle (what DCP's ``.metadata`` is)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".pt":
        torch.save(RunsCode(marker), path)
    else:
        path.write_bytes(pickle.dumps(RunsCode(marker)))


@pytest.mark.parametrize("unpickle", ["pickle", "torch.load"])
def test_the_payload_does_run_code_when_unpickled(tmp_path: Path, unpickle: str) -> None:
    marker = tmp_path / "ran"
    path = tmp_path / ("payload.pt" if unpickle == "torch.load" else ".metadata")
    write_payload(path, marker)
    if unpickle == "pickle":
        pickle.loads(path.read_bytes())
    else:
        torch.load(path, weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize(
    "name",
    [*CHECKPOINT_FILES, "state/.metadata", "trainer_state.pt", "optimizer.pt", "rank0.pt"],
)
def test_a_crafted_pickle_under_any_name_runs_no_code(
    tmp_path: Path, reference: RunResult, name: str
) -> None:
    """The crafted file is listed in the manifest with its own hash: only not unpickling it
    keeps it from running. The run still finishes as the reference did."""
    run = copy_of(reference, tmp_path)
    newest = run / "checkpoints" / "step_000003"
    marker = tmp_path / "ran"
    write_payload(newest / name, marker)
    if name != "manifest.json":
        rewrite_manifest(newest, name)
    resume(run)
    assert not marker.exists()
    assert_same_as_reference(run, reference)


# ------------------------------------------------------------------- killed runs, logs


def test_a_run_killed_before_its_first_checkpoint_resumes_from_step_0(
    tmp_path: Path, reference: RunResult, caplog: pytest.LogCaptureFixture
) -> None:
    """Killed while writing its first checkpoint: config, the logged steps 0 and 1, and a
    half-written ``step_000001.tmp``."""
    run = tmp_path / "run"
    partial = run / "checkpoints" / "step_000001.tmp"
    partial.mkdir(parents=True)
    (partial / "rank0.safetensors").write_bytes(b"half")
    shutil.copy(reference.run_dir / "config.yaml", run / "config.yaml")
    logged = (reference.run_dir / "metrics.jsonl").read_text().splitlines(keepends=True)
    (run / "metrics.jsonl").write_text("".join(logged[:2]))
    cfg = tiny_config(run, **UPDATES)
    with pytest.raises(ConfigError, match=r"pass --resume to continue it .*from step 0"):
        train(cfg)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        resumed = train(cfg, resume=True)
    assert "no intact checkpoint" in caplog.text and "starts again from step 0" in caplog.text
    assert steps_of(resumed) == [1, 2, 3]
    assert not partial.exists()
    assert_same_as_reference(run, reference)  # step 0's eval logged once, not twice


def test_a_cut_short_last_metrics_line_is_dropped_on_resume(
    tmp_path: Path, reference: RunResult
) -> None:
    """Killed while logging step 3 (before its checkpoint): the last line is half a record."""
    run = copy_of(reference, tmp_path)
    shutil.rmtree(run / "checkpoints" / "step_000003")
    text = (run / "metrics.jsonl").read_text()
    last = text.rstrip("\n").rsplit("\n", 1)[1]
    (run / "metrics.jsonl").write_text(text[: len(text) - len(last) // 2 - 1])
    assert steps_of(resume(run)) == [3]
    assert_same_as_reference(run, reference)


def test_a_moved_run_folder_resumes(tmp_path: Path, reference: RunResult) -> None:
    run = copy_of(reference, tmp_path)  # another output_dir than the one in config.yaml
    assert load_config(run / "config.yaml").output_dir != str(run)
    shutil.rmtree(run / "checkpoints" / "step_000003")
    assert steps_of(resume(run)) == [3]
    assert load_config(run / "config.yaml").output_dir == str(run)
    assert_same_as_reference(run, reference)
