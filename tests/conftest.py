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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the files that hold a ``slow`` test first, each file's tests in their order.

    ``make test`` hands whole files to two workers (``--dist loadfile``); a long file handed
    out last keeps one worker busy while the other has nothing left, so the long ones go
    first and the many short ones fill the end. A stable sort: the order is otherwise
    pytest's, the same in every worker."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)
