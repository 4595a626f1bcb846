"""Which torch functions a piece of code calls, and the shapes they return (not a test
module): for GPU costs that show on CPU as calls (a host sync such as ``torch.nonzero``, a
full-size ``Tensor.to`` copy of an LM head)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode


class OpRecorder(TorchFunctionMode):
    """Within ``with OpRecorder() as ops:``, ``ops.calls`` lists (name, output shape or
    None) of every torch function and tensor method called (forward and, on CPU, backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, tuple[int, ...] | None]] = []

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else None
        self.calls.append((getattr(func, "__name__", str(func)), shape))
        return out

    def shapes_of(self, name: str) -> list[tuple[int, ...] | None]:
        return [shape for called, shape in self.calls if called == name]
