"""Make OpenRLHF importable on CPU machines in tests.

OpenRLHF 0.11.2 imports ``flash_attn`` and ``vllm`` at module level; neither installs
without CUDA. ``install_openrlhf_stubs()`` puts the tiny test-only packages in
``tests/stubs`` (pure-PyTorch padding helpers, a ``vllm`` with ``SamplingParams``,
``inputs.TokensPrompt`` and ``utils.random_uuid``) at the end of ``sys.path``, so a real
installation of either package, if present, still wins.
"""

from __future__ import annotations

import sys
from pathlib import Path

STUBS_DIR = Path(__file__).resolve().parent.parent / "stubs"


def install_openrlhf_stubs() -> None:
    """Make ``import flash_attn`` and ``import vllm`` work, using a stub for each one missing.

    Idempotent. Appends ``tests/stubs`` to ``sys.path`` (last, so real packages win).
    """
    if str(STUBS_DIR) not in sys.path:
        sys.path.append(str(STUBS_DIR))
