"""Atomic checkpoints: written into a temporary folder, then renamed into place.

Layout of ``<run>/checkpoints/step_000012/``:

- ``model.safetensors``  policy weights (full, unsharded, the HF model's own key names);
- any ``extra_files`` (the trainer adds the HF ``config.json``, so the folder loads with
  ``AutoModelForCausalLM.from_pretrained``);
- ``optimizer.pt``, ``scheduler.pt``  their ``state_dict``s (full, unsharded);
- ``trainer_state.pt``  what the recipe keeps once (the data position);
- ``rank{r}.pt``  per-rank state of rank r (RNG states from ``capture_rng``, the credit
  strategy's state, and whatever else differs between ranks);
- ``manifest.json``  written last: step, world size, every file with its size in bytes.

Every file goes into ``step_000012.tmp`` first (fsync'ed); only then is the folder renamed
to its final name (``os.replace``, atomic on POSIX). A process killed at any moment leaves
either no ``step_000012`` or a complete one; leftover ``*.tmp`` folders are ignored and
removed by the next ``save_checkpoint``. ``find_latest`` also verifies the manifest, so a
folder damaged afterwards is skipped rather than loaded wrong.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"
TRAINER_FILE = "trainer_state.pt"
MANIFEST_FILE = "manifest.json"
_STEP_DIR = re.compile(r"^step_(\d{6,})$")


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


def capture_rng() -> dict[str, Any]:
    """This process's RNG states (Python, NumPy, torch CPU, every CUDA device)."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Inverse of ``capture_rng``."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _save_torch(obj: Any, path: Path) -> None:
    torch.save(obj, path)
    _fsync_file(path)


def save_checkpoint(
    root: str | Path,
    step: int,
    *,
    model_state: dict[str, torch.Tensor] | None,
    optimizer_state: dict[str, Any] | None,
    scheduler_state: dict[str, Any] | None,
    trainer_state: dict[str, Any] | None,
    rank_state: dict[str, Any],
    rank: int = 0,
    world_size: int = 1,
    barrier: Callable[[], None] = lambda: None,
    keep_last: int | None = None,
    extra_files: dict[str, str] | None = None,
) -> Path:
    """Write checkpoint ``step`` under ``root`` atomically; collective over all ranks.

    Rank 0 passes the full model/optimizer/scheduler/trainer states (other ranks pass None);
    every rank passes its own ``rank_state`` (e.g. ``{"rng": capture_rng()}``). Returns the
    final folder. With ``keep_last``, older checkpoints beyond the newest ``keep_last`` are
    removed afterwards.
    """
    root = Path(root)
    final = root / step_dir_name(step)
    tmp = root / (step_dir_name(step) + ".tmp")
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob("*.tmp"):
            shutil.rmtree(stale, ignore_errors=True)
        if final.exists():
            raise FileExistsError(f"checkpoint {final} already exists")
        tmp.mkdir()
    barrier()
    _save_torch(rank_state, tmp / f"rank{rank}.pt")
    if rank == 0:
        if model_state is None or trainer_state is None:
            raise ValueError("save_checkpoint: rank 0 must pass model_state and trainer_state")
        weights = {k: v.detach().to("cpu").contiguous().clone() for k, v in model_state.items()}
        save_file(weights, str(tmp / MODEL_FILE), metadata={"step": str(step)})
        _fsync_file(tmp / MODEL_FILE)
        _save_torch(optimizer_state, tmp / OPTIMIZER_FILE)
        _save_torch(scheduler_state, tmp / SCHEDULER_FILE)
        _save_torch(trainer_state, tmp / TRAINER_FILE)
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
            _fsync_file(tmp / name)
    barrier()
    if rank == 0:
        files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir())}
        manifest = {"step": step, "world_size": world_size, "files": files}
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1))
        _fsync_file(tmp / MANIFEST_FILE)
        _fsync_dir(tmp)
        os.replace(tmp, final)
        _fsync_dir(root)
        if keep_last is not None:
            for old in complete_checkpoints(root)[:-keep_last]:
                trash = old.with_name(old.name + ".tmp")
                os.replace(old, trash)
                shutil.rmtree(trash, ignore_errors=True)
    barrier()
    return final


def _is_complete(folder: Path) -> bool:
    try:
        manifest = json.loads((folder / MANIFEST_FILE).read_text())
        return all(
            (folder / name).stat().st_size == size for name, size in manifest["files"].items()
        )
    except (OSError, ValueError, KeyError, TypeError):
        return False


def complete_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoint folders under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _STEP_DIR.match(p.name)]
    return sorted((p for p in found if _is_complete(p)), key=lambda p: int(p.name[5:]))


def find_latest(root: str | Path) -> Path | None:
    """The newest complete checkpoint under ``root``, or None."""
    done = complete_checkpoints(root)
    return done[-1] if done else None


@dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint (CPU tensors)."""

    step: int
    model_state: dict[str, torch.Tensor]
    optimizer_state: dict[str, Any]
    scheduler_state: dict[str, Any]
    trainer_state: dict[str, Any]
    rank_state: dict[str, Any]


def load_checkpoint(folder: str | Path, *, rank: int = 0, world_size: int = 1) -> Checkpoint:
    """Load a complete checkpoint for ``rank``; the world size must match the saving run's."""
    folder = Path(folder)
    if not _is_complete(folder):
        raise ValueError(f"checkpoint {folder} is incomplete or damaged (manifest check failed)")
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    if manifest["world_size"] != world_size:
        raise ValueError(
            f"checkpoint {folder} was written by {manifest['world_size']} processes; "
            f"resuming with {world_size} would change the data sharding"
        )

    def load(name: str) -> Any:
        return torch.load(folder / name, map_location="cpu", weights_only=False)

    return Checkpoint(
        step=int(manifest["step"]),
        model_state=load_file(str(folder / MODEL_FILE)),
        optimizer_state=load(OPTIMIZER_FILE),
        scheduler_state=load(SCHEDULER_FILE),
        trainer_state=load(TRAINER_FILE),
        rank_state=load(f"rank{rank}.pt"),
    )
