"""Checkpoints: atomic, verified by content, stored without pickles (single process)."""

from __future__ import annotations

import hashlib
import json
import logging
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from backends.common.errors import ConfigError
from backends.torch import checkpoint as ckpt

SHARD = "state/shard-00001-model-00001-of-00001.safetensors"


def model_state(step: int) -> dict[str, torch.Tensor]:
    w = torch.full((2, 3), float(step))
    return {"w": w, "tied": w, "b": torch.arange(3.0)}  # "tied" is the same memory as "w"


def optimizer_state(step: int) -> dict[str, Any]:
    return {
        "state": {"w": {"exp_avg": torch.full((2, 3), step / 10), "step": torch.tensor(step)}},
        "param_groups": [{"lr": 0.1, "betas": (0.9, 0.99), "foreach": None, "params": ["w"]}],
    }


def state(step: int) -> ckpt.TrainingState:
    return ckpt.TrainingState(
        step=step,
        model=model_state(step),
        optimizer=optimizer_state(step),
        scheduler={"last_epoch": step, "_last_lr": [0.1]},
        trainer={"sampler": {"epoch": 0, "offset": step}},
        rank={"rng": ckpt.capture_rng(), "note": f"rank0 at {step}"},
    )


def save(root: Path, step: int, **kw: Any) -> Path:
    export = ckpt.ModelExport({"w": torch.ones(2)}, {"config.json": "{}"})
    return ckpt.save_checkpoint(root, state(step), export=export, **kw)


def load(folder: Path) -> ckpt.TrainingState:
    """Into zeroed templates shaped like step 0's, as a resumed run does."""
    zeros = ckpt.TrainingState(0, model_state(0), optimizer_state(0), {}, {}, {})
    return ckpt.load_checkpoint(folder, zeros.model, zeros.optimizer)


def test_round_trip(tmp_path: Path) -> None:
    folder = save(tmp_path, 3)
    assert folder.name == "step_000003"
    loaded = load(folder)
    assert loaded.step == 3
    torch.testing.assert_close(loaded.model["w"], torch.full((2, 3), 3.0))
    assert loaded.model["tied"] is loaded.model["w"]  # stored once, one tensor again
    torch.testing.assert_close(loaded.optimizer["state"]["w"]["exp_avg"], torch.full((2, 3), 0.3))
    assert int(loaded.optimizer["state"]["w"]["step"]) == 3
    assert loaded.optimizer["param_groups"] == [
        {"lr": 0.1, "betas": [0.9, 0.99], "foreach": None, "params": ["w"]}
    ]
    assert loaded.scheduler == {"last_epoch": 3, "_last_lr": [0.1]}
    assert loaded.trainer == {"sampler": {"epoch": 0, "offset": 3}}
    assert loaded.rank["note"] == "rank0 at 3"
    assert (folder / "config.json").read_text() == "{}"
    assert set(load_file(str(folder / "model.safetensors"))) == {"w"}


def test_rng_states_survive_a_checkpoint(tmp_path: Path) -> None:
    folder = save(tmp_path, 1)  # captures the RNG states now
    expected = (random.random(), float(np.random.rand()), torch.rand(4))
    ckpt.restore_rng(load(folder).rank["rng"])
    got = (random.random(), float(np.random.rand()), torch.rand(4))
    assert got[:2] == expected[:2]
    torch.testing.assert_close(got[2], expected[2])


def test_the_files_hold_no_pickle(tmp_path: Path) -> None:
    folder = save(tmp_path, 1)
    names = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    assert names == {
        "manifest.json",
        "train_state.json",
        "rank0.safetensors",
        "model.safetensors",
        "config.json",
        SHARD,
    }
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["world_size"] == 1
    assert set(manifest["files"]) == names - {"manifest.json"}
    assert all(len(entry["sha256"]) == 64 for entry in manifest["files"].values())


def test_state_that_is_not_tensors_or_plain_values_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="cannot store a ndarray at 'a/0'"):
        ckpt.split_tensors({"a": [np.zeros(2)]})
    with pytest.raises(TypeError, match="keys at 'a' must be strings"):
        ckpt.split_tensors({"a": {0: 1.0}})


def test_a_leftover_temporary_folder_is_ignored_and_cleaned(tmp_path: Path) -> None:
    save(tmp_path, 1)
    (tmp_path / "step_000002.tmp").mkdir()
    (tmp_path / "step_000002.tmp" / "model.safetensors").write_bytes(b"partial")
    assert ckpt.resume_point(tmp_path) == tmp_path / "step_000001"
    save(tmp_path, 2)
    assert not (tmp_path / "step_000002.tmp").exists()
    assert ckpt.resume_point(tmp_path) == tmp_path / "step_000002"


@pytest.mark.parametrize(
    ("name", "damage", "reason"),
    [
        ("train_state.json", "truncate", "bytes, the manifest says"),
        (SHARD, "garbage", "SHA-256 mismatch"),
        ("rank0.safetensors", "delete", "missing"),
        ("manifest.json", "garbage", "manifest.json: unreadable"),
        ("state/extra.safetensors", "create", "not in the manifest"),
    ],
)
def test_verification_names_each_damaged_file(
    tmp_path: Path, name: str, damage: str, reason: str
) -> None:
    folder = save(tmp_path, 1)
    path = folder / name
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:-1])
    elif damage == "garbage":
        path.write_bytes(bytes(len(path.read_bytes())))
    elif damage == "delete":
        path.unlink()
    else:
        path.write_bytes(b"x")
    problems = ckpt.verify_checkpoint(folder)
    assert len(problems) == 1 and str(path) in problems[0] and reason in problems[0], problems


def relist(folder: Path, name: str) -> None:
    """Update the manifest entry of ``name`` to its current content."""
    manifest = json.loads((folder / "manifest.json").read_text())
    data = (folder / name).read_bytes()
    manifest["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (folder / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        ("train_state.json", b"[]", "malformed (expected step, tensors"),
        ("config.json", b"{", "not valid json"),
        ("rank0.safetensors", b"", "not valid safetensors"),  # no RNG/strategy state in it
        (SHARD, b"\x80\x04K\x01.", "not valid safetensors"),  # a pickle
    ],
)
def test_a_file_listed_with_its_hash_must_still_parse(
    tmp_path: Path, name: str, content: bytes, reason: str
) -> None:
    folder = save(tmp_path, 1)
    if content:
        (folder / name).write_bytes(content)
    else:
        save_file({"t": torch.zeros(1)}, str(folder / name))
    relist(folder, name)
    problems = ckpt.verify_checkpoint(folder)
    assert len(problems) == 1 and str(folder / name) in problems[0] and reason in problems[0]


def test_a_checkpoint_of_the_earlier_pickle_format_is_refused(tmp_path: Path) -> None:
    old = tmp_path / "step_000004"
    old.mkdir()
    (old / "trainer_state.pt").write_bytes(b"pickle")
    (old / "manifest.json").write_text(
        '{"step": 4, "world_size": 1, "files": {"trainer_state.pt": 6}}'
    )
    with pytest.raises(ConfigError, match="step_000004 was written by an earlier version"):
        ckpt.resume_point(tmp_path)
    assert old.is_dir()  # left as it is


def test_a_damaged_newest_checkpoint_is_moved_aside_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    save(tmp_path, 1)
    for attempt in (1, 2):  # damaged twice at the same step: a new name each time
        bad = save(tmp_path, 2)
        (bad / SHARD).write_bytes(bytes((bad / SHARD).stat().st_size))
        with caplog.at_level(logging.WARNING, logger="backends.torch.checkpoint"):
            assert ckpt.resume_point(tmp_path) == tmp_path / "step_000001"
        assert f"step_000002.corrupt-{attempt}" in caplog.text and SHARD in caplog.text
        assert "resuming from " + str(tmp_path / "step_000001") in caplog.text
        assert (tmp_path / f"step_000002.corrupt-{attempt}").is_dir() and not bad.exists()


def test_no_checkpoint_means_step_0_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="backends.torch.checkpoint"):
        assert ckpt.resume_point(tmp_path / "checkpoints") is None
    assert "starts again from step 0" in caplog.text


def test_a_checkpoint_of_other_tensors_is_refused(tmp_path: Path) -> None:
    folder = save(tmp_path, 1)
    with pytest.raises(ConfigError, match=r"does not match .* lacks \['model/v'\]"):
        ckpt.load_checkpoint(folder, {**model_state(0), "v": torch.zeros(1)}, optimizer_state(0))


def test_keep_last_prunes_older_checkpoints(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        save(tmp_path, step, keep_last=2)
    assert [p.name for p in ckpt.checkpoint_folders(tmp_path)] == ["step_000002", "step_000003"]


def test_an_existing_step_is_never_overwritten(tmp_path: Path) -> None:
    save(tmp_path, 1)
    with pytest.raises(FileExistsError):
        save(tmp_path, 1)


class FakeCudaNode:
    """``torch.cuda``'s RNG functions on a node with ``count`` GPUs, this process on
    ``cuda:current``: one generator state per device, indexed as
    ``torch.cuda.default_generators`` is (IndexError past the last)."""

    def __init__(self, count: int, current: int) -> None:
        self.states = [torch.full((8,), i, dtype=torch.uint8) for i in range(count)]
        self.current = current

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """(Only around the RNG calls: DCP's writer would take the fake for a real GPU.)"""
        for module in (torch.cuda, torch.cuda.random):
            for name in ("get_rng_state", "set_rng_state", "get_rng_state_all"):
                monkeypatch.setattr(module, name, getattr(self, name), raising=False)
            monkeypatch.setattr(module, "set_rng_state_all", self.set_rng_state_all, raising=False)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: len(self.states))
        monkeypatch.setattr(torch.cuda, "current_device", lambda: self.current)

    def _index(self, device: Any) -> int:
        index = device if isinstance(device, int) else torch.device(device).index
        return self.current if index is None else index

    def get_rng_state(self, device: Any = "cuda") -> torch.Tensor:
        return self.states[self._index(device)].clone()

    def set_rng_state(self, new_state: torch.Tensor, device: Any = "cuda") -> None:
        self.states[self._index(device)] = new_state.clone()

    def get_rng_state_all(self) -> list[torch.Tensor]:
        return [s.clone() for s in self.states]

    def set_rng_state_all(self, new_states: list[torch.Tensor]) -> None:
        for i, state in enumerate(new_states):
            self.set_rng_state(state, i)


def test_a_rank_resumes_its_cuda_rng_on_a_node_with_fewer_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Saved by the rank on cuda:3 of a 4-GPU node, resumed by the rank on cuda:0 of a
    1-GPU node: that rank's generator gets cuda:3's state (only that device's is stored)."""
    saving = FakeCudaNode(4, current=3)
    saving.states[3] = torch.arange(8, dtype=torch.uint8)
    with monkeypatch.context() as patched:
        saving.install(patched)
        rng = ckpt.capture_rng()
    folder = ckpt.save_checkpoint(tmp_path, replace(state(1), rank={"rng": rng}))
    resuming = FakeCudaNode(1, current=0)
    with monkeypatch.context() as patched:
        resuming.install(patched)
        ckpt.restore_rng(load(folder).rank["rng"])
    assert torch.equal(resuming.states[0], torch.arange(8, dtype=torch.uint8))
    assert torch.equal(rng["cuda"], torch.arange(8, dtype=torch.uint8))


def test_the_rank_device_given_explicitly_is_the_one_stored_and_restored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = FakeCudaNode(2, current=0)
    node.states[1] = torch.arange(8, dtype=torch.uint8)
    monkeypatch.setattr(torch.cuda, "get_rng_state", node.get_rng_state)
    monkeypatch.setattr(torch.cuda, "set_rng_state", node.set_rng_state)
    rng = ckpt.capture_rng(torch.device("cuda", 1))
    assert torch.equal(rng["cuda"], torch.arange(8, dtype=torch.uint8))
    ckpt.restore_rng(rng, torch.device("cuda", 0))
    assert torch.equal(node.states[0], torch.arange(8, dtype=torch.uint8))
    assert "cuda" not in ckpt.capture_rng(torch.device("cpu"))
