"""Checkpoints: sharded, atomic, verified by content, and never unpickled.

Layout of ``<run>/checkpoints/step_000012/``:

- ``state/``  the model and optimizer tensors (and those of further trained models: the
  critic of PPO with a critic, PRIME's pi_phi),
  written with ``torch.distributed.checkpoint`` (DCP) as safetensors: every rank writes its
  own shards (nothing is gathered), and DCP reshards on load, so a run resumes on the same
  or a different number of processes;
- ``train_state.json``  what every rank shares: the optimizer's plain values (param groups),
  the scheduler, the trainer's state (the data position) and where each tensor of the model
  and optimizer states lives in ``state/``;
- ``rank{r}.safetensors``  rank r's own state (RNG states, the credit strategy's state): its
  tensors, with the plain values as JSON in the file's metadata;
- ``model.safetensors`` + any export files (the trainer adds the HF ``config.json``): the full
  policy under the HF model's own key names, for ``AutoModelForCausalLM.from_pretrained``;
  not read on resume;
- ``manifest.json``  written last: step, world size, every file's size and SHA-256.

Files are parsed only as JSON or safetensors (DCP's own pickled ``.metadata`` is neither
written nor read), so nothing in a run folder can run code. Every file goes into
``step_000012.tmp`` first; only then is the folder renamed to its final name (``os.replace``,
atomic on POSIX): a process killed at any moment leaves no ``step_000012`` or a complete one.
``resume_point`` verifies checkpoints newest first against their manifests, moves a damaged
one aside (``step_000012.corrupt-1``), says so, and returns the newest intact one.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import random
import re
import shutil
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.hf_storage import (
    HuggingFaceStorageReader,
    HuggingFaceStorageWriter,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from backends.common.cli import CommandError
from backends.common.errors import ConfigError
from backends.torch.distributed import DistContext

log = logging.getLogger(__name__)

STATE_DIR = "state"
TRAIN_STATE_FILE = "train_state.json"
MODEL_FILE = "model.safetensors"
MANIFEST_FILE = "manifest.json"
_STEP_DIR = re.compile(r"^step_(\d{6,})$")
_RANK_FILE = re.compile(r"^rank\d+\.safetensors$")
_TENSOR = "__tensor__"  # placeholder key: {"__tensor__": name} stands for a stored tensor
_LOCAL = DistContext(0, 1, 0, torch.device("cpu"), None)


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


def rank_file_name(rank: int) -> str:
    return f"rank{rank}.safetensors"


# ------------------------------------------------------------------------ plain values


def _memory_key(tensor: torch.Tensor) -> tuple[Any, ...] | None:
    """Identifies the memory a tensor views (a DTensor: its local shard); None if empty."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    if local.numel() == 0:
        return None
    return (
        local.device,
        local.untyped_storage().data_ptr(),
        local.storage_offset(),
        tuple(local.shape),
        tuple(local.stride()),
        local.dtype,
    )


def split_tensors(tree: Any, path: str = "") -> tuple[dict[str, torch.Tensor], Any]:
    """Separate the tensors of a state tree from its plain values.

    Returns the tensors by path (``"optimizer/state/w/exp_avg"``) and a JSON-able copy of
    ``tree`` in which each tensor is replaced by ``{"__tensor__": path}``. Allowed leaves:
    tensors, None, bool, int, float, str; containers: dicts with string keys, lists, tuples
    (stored as lists). Anything else raises ``TypeError`` naming its path. Tensors that are
    the same memory (tied weights) are stored once: their placeholders name the first path.
    """
    tensors: dict[str, torch.Tensor] = {}
    first_path: dict[tuple[Any, ...], str] = {}

    def walk(node: Any, where: str) -> Any:
        if isinstance(node, torch.Tensor):
            alias = _memory_key(node)
            if alias is not None and alias in first_path:
                return {_TENSOR: first_path[alias]}
            if alias is not None:
                first_path[alias] = where
            tensors[where] = node
            return {_TENSOR: where}
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if isinstance(node, Mapping):
            bad = [k for k in node if not isinstance(k, str)]
            if bad:
                raise TypeError(f"checkpoint: keys at {where or '/'!r} must be strings, got {bad}")
            return {k: walk(v, f"{where}/{k}" if where else k) for k, v in node.items()}
        if isinstance(node, (list, tuple)):
            return [walk(v, f"{where}/{i}" if where else str(i)) for i, v in enumerate(node)]
        raise TypeError(
            f"checkpoint: cannot store a {type(node).__name__} at {where or '/'!r}; "
            "state must be tensors and plain values (dict, list, str, number, bool, None)"
        )

    return tensors, walk(tree, path)


def tensor_names(skeleton: Any) -> set[str]:
    """The tensor paths referenced by a ``split_tensors`` skeleton."""
    if isinstance(skeleton, dict):
        if set(skeleton) == {_TENSOR}:
            return {skeleton[_TENSOR]}
        return set().union(*(tensor_names(v) for v in skeleton.values()))
    if isinstance(skeleton, list):
        return set().union(*(tensor_names(v) for v in skeleton))
    return set()


def join_tensors(skeleton: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    """Inverse of ``split_tensors``: the skeleton with its placeholders replaced."""
    if isinstance(skeleton, dict):
        if set(skeleton) == {_TENSOR}:
            return tensors[skeleton[_TENSOR]]
        return {k: join_tensors(v, tensors) for k, v in skeleton.items()}
    if isinstance(skeleton, list):
        return [join_tensors(v, tensors) for v in skeleton]
    return skeleton


# ---------------------------------------------------------------------------- RNG state


def _rank_device(device: torch.device | None) -> torch.device:
    """``device``, or by default this process's current CUDA device (``init_distributed``
    sets it to the rank's) when CUDA is available, else the CPU."""
    if device is not None:
        return device
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def capture_rng(device: torch.device | None = None) -> dict[str, Any]:
    """This process's RNG states (Python, NumPy, torch CPU and, when the rank's ``device``
    is a CUDA device, that device's generator: never the other visible GPUs'), as tensors
    and plain values (storable by ``split_tensors``)."""
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = cast(
        tuple[str, np.ndarray, int, int, float], np.random.get_state(legacy=True)
    )
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
        "torch": torch.get_rng_state(),
    }
    dev = _rank_device(device)
    if dev.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(dev)
    return state


def restore_rng(state: Mapping[str, Any], device: torch.device | None = None) -> None:
    """Inverse of ``capture_rng`` (also after a round trip through a checkpoint): the saved
    CUDA generator state goes to the rank's ``device``, whichever device saved it, so a run
    resumes on a node with fewer (or other) GPUs; on a CPU device it is not used."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    dev = _rank_device(device)
    if "cuda" in state and dev.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], dev)


# ------------------------------------------------------------------------------- files


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


def _write_text(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")
    _fsync_file(path)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _files_under(folder: Path) -> list[str]:
    """Every file under ``folder``, as sorted relative POSIX paths."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


@contextlib.contextmanager
def _quiet_single_process() -> Iterator[None]:
    """DCP warns on every single-process save/load, even when asked for one; silence it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        yield


def _write_safetensors(
    path: Path, tensors: Mapping[str, torch.Tensor], metadata: dict[str, str]
) -> None:
    stored = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}
    save_file(stored, str(path), metadata=metadata)
    _fsync_file(path)


def _write_rank_file(path: Path, state: Mapping[str, Any]) -> None:
    tensors, skeleton = split_tensors(state)
    _write_safetensors(path, tensors, {"state": json.dumps(skeleton)})


def _read_rank_file(path: Path) -> dict[str, Any]:
    with safe_open(str(path), framework="pt") as fh:
        skeleton = json.loads((fh.metadata() or {})["state"])
    return dict(join_tensors(skeleton, load_file(str(path))))


def _hash_share(folder: Path, names: list[str], ctx: DistContext) -> dict[str, str]:
    """SHA-256 of every file in ``names``; each rank hashes its share (collective)."""
    mine = {n: _sha256(folder / n) for n in names[ctx.rank :: ctx.world_size]}
    merged: dict[str, str] = {}
    for part in ctx.all_gather_object(mine):
        merged.update(part)
    return merged


# -------------------------------------------------------------------------------- save


class CheckpointWriteError(CommandError):
    """A checkpoint could not be written (full disk, quota, permission, ...); the message
    names the folder, the cause and the newest intact checkpoint, which is untouched."""


def remove_partial(root: str | Path) -> list[Path]:
    """Remove the ``step_N.tmp`` folders under ``root``: checkpoints whose writing started
    and never completed (a kill, a full disk). Returns what was removed."""
    root = Path(root)
    stale = sorted(root.glob("*.tmp")) if root.is_dir() else []
    for folder in stale:
        shutil.rmtree(folder, ignore_errors=True)
        log.warning("removed %s, a checkpoint whose writing never completed", folder)
    return stale


def _os_error(exc: BaseException) -> OSError | None:
    """The ``OSError`` behind a write failure: ``exc`` itself, its cause or context, or one
    of the per-rank failures of DCP's ``CheckpointException``."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError):
            return e
        if isinstance(e, CheckpointException):
            todo.extend(pair[0] for pair in e.failures.values())  # (exception, trace)
        todo.extend([e.__cause__, e.__context__])
    return None


def _cause(exc: BaseException, folder: Path) -> str:
    """What a write failure means, in words (free space for a full disk)."""
    os_error = _os_error(exc)
    if os_error is None:
        return f"{type(exc).__name__}: {exc}"
    what = os_error.strerror or str(os_error)
    if os_error.errno == errno.ENOSPC:
        try:
            free = shutil.disk_usage(folder).free / 2**20
            what += f" ({free:.1f} MiB free on that filesystem)"
        except OSError:
            pass
    elif os_error.errno == errno.EDQUOT:
        what += " (disk quota exceeded for this user)"
    elif os_error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        what += " (no permission to write there)"
    return what


def _agreed(ctx: DistContext, root: Path, write: Callable[[], None]) -> None:
    """Run this rank's ``write``; collective: if it failed on any rank, every rank raises
    the same ``OSError`` naming the ranks and causes (no rank is left waiting)."""
    problem = None
    try:
        write()
    except (OSError, CheckpointException) as exc:
        problem = f"rank {ctx.rank}: {_cause(exc, root)}"
    problems = [p for p in ctx.all_gather_object(problem) if p is not None]
    if problems:
        raise OSError("; ".join(problems))


@dataclass(frozen=True)
class TrainingState:
    """One rank's view of everything a checkpoint restores.

    ``model`` and ``optimizer`` are DCP's state dicts (``get_model_state_dict`` /
    ``get_optimizer_state_dict``: parameter names as keys, tensors or DTensor shards);
    ``scheduler`` and ``trainer`` are plain values, the same on every rank; ``rank`` is this
    rank's own state (tensors and plain values); ``extra`` the DCP state dicts of further
    trained models by name (``{"implicit_prm": {"model": ..., "optimizer": ...}}`` for
    PRIME's pi_phi), written and resharded like the policy's; empty for most runs.
    """

    step: int
    model: dict[str, Any]
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    trainer: dict[str, Any]
    rank: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelExport:
    """The policy for other tools: full weights (HF key names) and extra text files."""

    weights: dict[str, torch.Tensor]
    files: dict[str, str] = field(default_factory=dict)


def save_checkpoint(
    root: str | Path,
    state: TrainingState,
    *,
    export: ModelExport | None = None,
    ctx: DistContext = _LOCAL,
    keep_last: int | None = None,
) -> Path:
    """Write checkpoint ``state.step`` under ``root`` atomically; collective over all ranks.

    Every rank passes its own ``state`` (its shards and rank state); rank 0 also passes the
    ``export``. Returns the final folder. Raises ``FileExistsError`` if that step exists.
    With ``keep_last``, older checkpoints beyond the newest ``keep_last`` are removed.
    """
    root = Path(root)
    final = root / step_dir_name(state.step)
    tmp = root / (step_dir_name(state.step) + ".tmp")
    if ctx.broadcast_object(final.exists()):
        raise FileExistsError(f"checkpoint {final} already exists")
    try:
        _agreed(ctx, root, lambda: _begin(root, tmp, ctx))
        _agreed(ctx, root, lambda: _write_state(tmp, state, export, ctx))
        names = _files_under(tmp)
        digests = _hash_share(tmp, names, ctx)
        _agreed(ctx, root, lambda: _commit(tmp, final, names, digests, state.step, ctx))
    except OSError as exc:
        if ctx.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        intact = [f.name for f in checkpoint_folders(root) if f != final]
        kept = (
            f"the newest checkpoint, {intact[-1]}, is untouched"
            if intact
            else "there is no earlier checkpoint"
        )
        raise CheckpointWriteError(
            f"checkpoint of step {state.step} could not be written under {root}: {exc}; "
            f"the partial {tmp.name} was removed; {kept}; free space or choose another "
            "output_dir, then continue with --resume"
        ) from exc
    if ctx.is_main and keep_last is not None:
        for old in checkpoint_folders(root)[:-keep_last]:
            trash = old.with_name(old.name + ".tmp")
            os.replace(old, trash)
            shutil.rmtree(trash, ignore_errors=True)
    ctx.barrier()
    return final


def _begin(root: Path, tmp: Path, ctx: DistContext) -> None:
    if ctx.is_main:
        root.mkdir(parents=True, exist_ok=True)
        remove_partial(root)
        tmp.mkdir()


def _write_state(
    tmp: Path, state: TrainingState, export: ModelExport | None, ctx: DistContext
) -> None:
    """Every rank's shards and rank file; rank 0 also the shared state and the export."""
    tensors, skeleton = split_tensors(
        {"model": state.model, "optimizer": state.optimizer, "extra": state.extra}
    )
    with _quiet_single_process():
        dcp_save(
            tensors,
            storage_writer=HuggingFaceStorageWriter(str(tmp / STATE_DIR), save_distributed=True),
            no_dist=not ctx.active,
        )
    _write_rank_file(tmp / rank_file_name(ctx.rank), state.rank)
    if ctx.is_main:
        shared = {
            "step": state.step,
            "tensors": skeleton,
            "scheduler": state.scheduler,
            "trainer": state.trainer,
        }
        stray, doc = split_tensors(shared)
        if stray:
            raise TypeError(f"checkpoint: scheduler/trainer state holds tensors {sorted(stray)}")
        _write_text(tmp / TRAIN_STATE_FILE, json.dumps(doc))
        if export is not None:
            _write_safetensors(tmp / MODEL_FILE, export.weights, {"step": str(state.step)})
            for name, text in export.files.items():
                _write_text(tmp / name, text)


def _commit(
    tmp: Path, final: Path, names: list[str], digests: dict[str, str], step: int, ctx: DistContext
) -> None:
    """Rank 0 writes the manifest and renames ``tmp`` to ``final`` (atomic)."""
    if not ctx.is_main:
        return
    files = {n: {"bytes": (tmp / n).stat().st_size, "sha256": digests[n]} for n in names}
    manifest = {"step": step, "world_size": ctx.world_size, "files": files}
    _write_text(tmp / MANIFEST_FILE, json.dumps(manifest, indent=1))
    _fsync_dir(tmp / STATE_DIR)
    _fsync_dir(tmp)
    os.replace(tmp, final)
    _fsync_dir(final.parent)


# ------------------------------------------------------------------------------ verify


def checkpoint_folders(root: str | Path) -> list[Path]:
    """The ``step_*`` folders under ``root`` (intact or not), oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _STEP_DIR.match(p.name)]
    return sorted(found, key=lambda p: int(p.name[5:]))


def read_manifest(folder: Path) -> dict[str, Any]:
    """The manifest of ``folder``; ``ValueError`` naming the file if unreadable or malformed."""
    file = folder / MANIFEST_FILE
    try:
        manifest = json.loads(file.read_text(encoding="utf-8"))
        files = manifest["files"]
        ok = (
            isinstance(manifest["step"], int)
            and isinstance(manifest["world_size"], int)
            and manifest["world_size"] >= 1
            and isinstance(files, dict)
            and all(
                isinstance(m, dict) and isinstance(m["bytes"], int) and isinstance(m["sha256"], str)
                for m in files.values()
            )
        )
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{file}: unreadable ({type(exc).__name__}: {exc})") from None
    if not ok:
        raise ValueError(f"{file}: malformed (expected step, world_size, files with bytes/sha256)")
    return dict(manifest)


def _is_train_state(doc: Any) -> bool:
    return (
        isinstance(doc, dict)
        and isinstance(doc.get("step"), int)
        and "tensors" in doc
        and isinstance(doc.get("scheduler"), dict)
        and isinstance(doc.get("trainer"), dict)
    )


def _parse_problem(path: Path) -> str | None:
    """Why a file that is parsed on resume cannot be (None if it parses as it should)."""
    try:
        if path.suffix == ".json":
            doc = json.loads(path.read_text(encoding="utf-8"))
            if path.name == TRAIN_STATE_FILE and not _is_train_state(doc):
                return f"{path}: malformed (expected step, tensors, scheduler, trainer)"
        elif path.suffix == ".safetensors":
            with safe_open(str(path), framework="pt") as fh:
                fh.keys()
                if _RANK_FILE.match(path.name):
                    json.loads((fh.metadata() or {})["state"])
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, SafetensorError) as exc:
        return f"{path}: not valid {path.suffix[1:]} ({type(exc).__name__}: {exc})"
    return None


def verify_checkpoint(folder: str | Path, ctx: DistContext = _LOCAL) -> list[str]:
    """What is wrong with checkpoint ``folder``, one message per damaged file (empty: intact).

    Checks the manifest, that every file it lists exists with its size and SHA-256, that
    ``state/`` holds no other file, and that the JSON and safetensors files parse. Each rank
    hashes a share of the files (collective); every rank returns the same list.
    """
    folder = Path(folder)
    try:
        manifest = read_manifest(folder)
    except ValueError as exc:
        return [str(exc)]
    listed: dict[str, dict[str, Any]] = manifest["files"]
    on_disk = set(_files_under(folder)) - {MANIFEST_FILE}
    problems = [f"{folder / n}: missing" for n in sorted(set(listed) - on_disk)]
    problems += [
        f"{folder / n}: not in the manifest"
        for n in sorted(on_disk - set(listed))
        if n.startswith(STATE_DIR + "/")
    ]
    mine: list[str] = []
    for name in sorted(set(listed) & on_disk)[ctx.rank :: ctx.world_size]:
        path, want = folder / name, listed[name]
        size = path.stat().st_size
        if size != want["bytes"]:
            mine.append(f"{path}: {size} bytes, the manifest says {want['bytes']}")
        elif _sha256(path) != want["sha256"]:
            mine.append(f"{path}: content differs from the manifest (SHA-256 mismatch)")
        elif (problem := _parse_problem(path)) is not None:
            mine.append(problem)
    for part in ctx.all_gather_object(mine):
        problems += part
    return problems


def _move_aside(folder: Path) -> Path:
    """Rename a damaged checkpoint to ``<name>.corrupt-<n>`` (the first free n)."""
    n = 1
    while (target := folder.with_name(f"{folder.name}.corrupt-{n}")).exists():
        n += 1
    os.replace(folder, target)
    return target


def _written_by_an_earlier_version(folder: Path) -> bool:
    """Its manifest lists sizes only (``{"files": {name: bytes}}``): the pickle format."""
    try:
        files = json.loads((folder / MANIFEST_FILE).read_text(encoding="utf-8"))["files"]
        return bool(files) and all(isinstance(size, int) for size in files.values())
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
        return False


def resume_point(root: str | Path, ctx: DistContext = _LOCAL) -> Path | None:
    """The newest intact checkpoint under ``root``; collective.

    None (with a warning: the run starts again from step 0) if there is none. Every newer
    damaged one is moved aside to ``step_N.corrupt-<k>`` (so the resumed run can
    write ``step_N`` again) with a warning that names its damaged files.
    """
    candidates: list[Path] = ctx.broadcast_object(checkpoint_folders(root)[::-1])
    for folder in candidates:
        if _written_by_an_earlier_version(folder):
            raise ConfigError(
                f"checkpoint {folder} was written by an earlier version of the trainer (pickled "
                "files, which this version never loads: they could run code); finish the run "
                "with that version, or start a new one in another output_dir"
            )
        problems = verify_checkpoint(folder, ctx)
        if not problems:
            if folder != candidates[0] and ctx.is_main:
                log.warning("resuming from %s, the newest intact checkpoint", folder)
            return folder
        if ctx.is_main:
            moved = _move_aside(folder)
            log.warning(
                "checkpoint %s is damaged and was skipped (moved aside to %s):\n  %s",
                folder,
                moved.name,
                "\n  ".join(problems),
            )
        ctx.barrier()
    if ctx.is_main:
        log.warning("no intact checkpoint under %s: the run starts again from step 0", root)
    return None


# -------------------------------------------------------------------------------- load


def load_checkpoint(
    folder: str | Path,
    model_state: dict[str, Any],
    optimizer_state: dict[str, Any],
    ctx: DistContext = _LOCAL,
    *,
    extra_state: dict[str, Any] | None = None,
) -> TrainingState:
    """Load checkpoint ``folder`` (verified by ``resume_point``) for this rank; collective.

    ``model_state`` and ``optimizer_state`` are this run's DCP state dicts: their tensors,
    sharded as this run shards them, are filled in place and returned in the result, and so
    are those of ``extra_state`` (``TrainingState.extra``; None: no further model). Rank r
    of a run with a different number of processes gets the rank state of saved rank
    ``r % saved_world_size``. Raises ``ConfigError`` if the checkpoint holds other tensors.
    """
    folder = Path(folder)
    manifest = read_manifest(folder)
    shared = json.loads((folder / TRAIN_STATE_FILE).read_text(encoding="utf-8"))
    tensors, _ = split_tensors(
        {"model": model_state, "optimizer": optimizer_state, "extra": extra_state or {}}
    )
    saved = tensor_names(shared["tensors"])
    if saved != set(tensors):
        missing, extra = sorted(set(tensors) - saved), sorted(saved - set(tensors))
        raise ConfigError(
            f"checkpoint {folder} does not match this run's model/optimizer: it lacks "
            f"{missing[:5]} and has {extra[:5]} in addition; resume with the run's own config"
        )
    with _quiet_single_process():
        dcp_load(
            tensors,
            storage_reader=HuggingFaceStorageReader(str(folder / STATE_DIR)),
            no_dist=not ctx.active,
        )
    restored = join_tensors(shared["tensors"], tensors)
    saved_world = int(manifest["world_size"])
    if saved_world != ctx.world_size and ctx.is_main:
        log.warning(
            "checkpoint %s was written by %d processes, resuming with %d: model and optimizer "
            "are resharded, the global batch is unchanged; rank r takes the RNG and "
            "credit-strategy state of saved rank r %% %d",
            folder,
            saved_world,
            ctx.world_size,
            saved_world,
        )
    return TrainingState(
        step=int(shared["step"]),
        model=restored["model"],
        optimizer=restored["optimizer"],
        scheduler=shared["scheduler"],
        trainer=shared["trainer"],
        rank=_read_rank_file(folder / rank_file_name(ctx.rank % saved_world)),
        extra=restored.get("extra", {}),
    )
