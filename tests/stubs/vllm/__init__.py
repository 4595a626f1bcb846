"""Test-only stand-in for ``vllm`` (CUDA-only), enough for OpenRLHF's modules to import.

Provides ``SamplingParams``, ``inputs.TokensPrompt`` and ``utils.random_uuid``; any other
attribute raises ``AttributeError`` saying this is a stub, so nothing runs a fake engine.
Never installed: tests put ``tests/stubs`` on ``sys.path``
(see ``tests/helpers/openrlhf_stubs.py``).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.0.0+test.stub"


class SamplingParams:
    """Keeps the keyword arguments it was built with as attributes."""

    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)

    def __repr__(self) -> str:
        return f"SamplingParams({self.__dict__!r})"


def __getattr__(name: str) -> Any:
    raise AttributeError(f"vllm test stub: {name!r} is not available (vllm is not installed)")
