"""Shared pytest fixtures (keep generic: every area's tests see this file)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(scope="module")
def single_torch_thread() -> Iterator[None]:
    """Run a module's tests with one intra-op torch thread, then restore the setting.

    For tests made of many tiny tensor ops: on a shared, busy CPU each multi-threaded op
    can wait milliseconds for its worker threads. Opt in with
    ``pytestmark = pytest.mark.usefixtures("single_torch_thread")``.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
