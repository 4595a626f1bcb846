"""Atomic checkpoints: complete or absent, never half-written under a final name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from backends.torch import checkpoint as ckpt


def save(root: Path, step: int, **kw: object) -> Path:
    args: dict[str, object] = {
        "model_state": {"w": torch.full((2, 3), float(step)), "b": torch.arange(3.0)},
        "optimizer_state": {"state": {}, "step": step},
        "scheduler_state": {"last_epoch": step},
        "trainer_state": {"sampler": {"epoch": 0, "offset": step}},
        "rank_state": {"rng": ckpt.capture_rng(), "note": f"rank0 at {step}"},
    }
    args.update(kw)
    return ckpt.save_checkpoint(root, step, **args)  # type: ignore[arg-type]


def test_round_trip(tmp_path: Path) -> None:
    folder = save(tmp_path, 3, extra_files={"config.json": "{}"})
    assert folder.name == "step_000003"
    loaded = ckpt.load_checkpoint(folder)
    assert loaded.step == 3
    torch.testing.assert_close(loaded.model_state["w"], torch.full((2, 3), 3.0))
    assert loaded.optimizer_state == {"state": {}, "step": 3}
    assert loaded.trainer_state["sampler"]["offset"] == 3
    assert loaded.rank_state["note"] == "rank0 at 3"
    assert (folder / "config.json").read_text() == "{}"


def test_rng_state_restores_the_random_stream(tmp_path: Path) -> None:
    state = ckpt.capture_rng()
    first = torch.rand(4)
    ckpt.restore_rng(state)
    torch.testing.assert_close(torch.rand(4), first)


def test_a_leftover_temporary_folder_is_ignored_and_cleaned(tmp_path: Path) -> None:
    save(tmp_path, 1)
    (tmp_path / "step_000002.tmp").mkdir()
    (tmp_path / "step_000002.tmp" / "model.safetensors").write_bytes(b"partial")
    assert ckpt.find_latest(tmp_path) == tmp_path / "step_000001"
    save(tmp_path, 2)
    assert not (tmp_path / "step_000002.tmp").exists()
    assert ckpt.find_latest(tmp_path) == tmp_path / "step_000002"


def test_a_damaged_checkpoint_is_skipped_and_refused(tmp_path: Path) -> None:
    save(tmp_path, 1)
    bad = save(tmp_path, 2)
    (bad / "optimizer.pt").write_bytes(b"truncated")
    assert ckpt.find_latest(tmp_path) == tmp_path / "step_000001"
    with pytest.raises(ValueError, match="incomplete or damaged"):
        ckpt.load_checkpoint(bad)


def test_a_folder_without_manifest_is_not_a_checkpoint(tmp_path: Path) -> None:
    folder = save(tmp_path, 1)
    (folder / "manifest.json").unlink()
    assert ckpt.find_latest(tmp_path) is None


def test_keep_last_prunes_older_checkpoints(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        save(tmp_path, step, keep_last=2)
    assert [p.name for p in ckpt.complete_checkpoints(tmp_path)] == ["step_000002", "step_000003"]


def test_world_size_must_match(tmp_path: Path) -> None:
    folder = save(tmp_path, 1)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["world_size"] == 1
    with pytest.raises(ValueError, match="written by 1 processes"):
        ckpt.load_checkpoint(folder, world_size=2)


def test_an_existing_step_is_never_overwritten(tmp_path: Path) -> None:
    save(tmp_path, 1)
    with pytest.raises(FileExistsError):
        save(tmp_path, 1)
