"""The verl tests run in .venv-verl (``make verl``) on verl's own code, on the CPU.

Where verl is installed, verl is pointed at the test-only CPU platform before anything
imports it: ``VERL_USE_EXTERNAL_MODULES`` makes ``import verl`` import
``tests.backends.verl.cpu_platform`` (which registers the platform) before the plugins of
the ``verl.plugins`` entry point (this project's ``backends.verl.plugin``), and
``VERL_PLATFORM=cpu`` selects it. Elsewhere each test module skips, saying why.

Fixtures shared by the engine and trainer tests: ``models`` (a tiny policy and reward
model, saved) and ``process_group`` (a one-rank gloo group).
"""

from __future__ import annotations

import importlib.util
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

if importlib.util.find_spec("verl") is not None:
    os.environ.setdefault("VERL_PLATFORM", "cpu")
    os.environ["VERL_USE_EXTERNAL_MODULES"] = "tests.backends.verl.cpu_platform"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny random Qwen2 policy and a tiny Llama reward model, saved with one tokenizer."""
    from adapters.tiny import TINY_CORPUS, tiny_causal_lm, tiny_seq_classifier, train_bpe_tokenizer

    root = tmp_path_factory.mktemp("verl_models")
    tokenizer = train_bpe_tokenizer(TINY_CORPUS, 256)
    policy, rm = root / "policy", root / "rm"
    tiny_causal_lm("qwen2", len(tokenizer)).save_pretrained(policy)
    tiny_seq_classifier("llama", len(tokenizer), seed=1).save_pretrained(rm)
    for path in (policy, rm):
        tokenizer.save_pretrained(path)
    return policy, rm


@pytest.fixture(scope="session")
def process_group() -> Iterator[None]:
    """A one-rank gloo group, as verl's worker would have."""
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1
    )
    yield
    torch.distributed.destroy_process_group()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
