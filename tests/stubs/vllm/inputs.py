"""Stub of ``vllm.inputs``: only the ``TokensPrompt`` mapping type."""

from __future__ import annotations

from typing import Any


class TokensPrompt(dict[str, Any]):
    """A prompt given as token ids: ``TokensPrompt(prompt_token_ids=[...])``."""
