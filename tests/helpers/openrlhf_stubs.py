"""Make OpenRLHF importable on CPU machines in tests.

OpenRLHF 0.11.2 imports ``flash_attn`` and ``vllm`` at module level; neither installs
without CUDA. ``install_openrlhf_stubs()`` puts the tiny test-only packages in
``tests/stubs`` (pure-PyTorch padding helpers, a ``vllm`` with ``SamplingParams``,
``inputs.TokensPrompt`` and ``utils.random_uuid``) at the end of ``sys.path``, so a real
installation of either package, if present, still wins.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

STUBS_DIR = Path(__file__).resolve().parent.parent / "stubs"


def install_openrlhf_stubs() -> None:
    """Make ``import flash_attn`` and ``import vllm`` work, using a stub for each one missing.

    Idempotent. Appends ``tests/stubs`` to ``sys.path`` (last, so real packages win).
    """
    if str(STUBS_DIR) not in sys.path:
        sys.path.append(str(STUBS_DIR))


@contextlib.contextmanager
def stubs_hidden() -> Iterator[None]:
    """Inside the block, ``tests/stubs`` is off ``sys.path`` and no stub module is imported:
    a library that probes for vllm or flash_attn (TRL does, at import) sees neither."""
    on_path = str(STUBS_DIR) in sys.path
    if on_path:
        sys.path.remove(str(STUBS_DIR))
    names = {p.name for p in STUBS_DIR.iterdir() if p.is_dir()}
    saved = {k: m for k, m in sys.modules.items() if k.split(".")[0] in names}
    for key in saved:
        del sys.modules[key]
    try:
        yield
    finally:
        sys.modules.update(saved)
        if on_path:
            sys.path.append(str(STUBS_DIR))
