"""Stub of ``vllm.utils``: only ``random_uuid``."""

from __future__ import annotations

import uuid


def random_uuid() -> str:
    """A random 32-character hex id, as vllm's."""
    return uuid.uuid4().hex
