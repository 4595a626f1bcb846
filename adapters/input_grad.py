"""A reward model's output and its reward's gradient at its input embeddings, from one
forward and one backward of the model as its framework calls it.

The frameworks' own reward passes (TRL's ``_calculate_rewards``, OpenRLHF's reward actors)
call the model on token ids, under ``no_grad`` / ``inference_mode``. To get DATC's reward
gradient from that same pass, ``forward_with_input_grad`` runs the framework's call with
gradients on, a forward hook on the model's input-embedding module making its output
E[ids] a leaf, and one ``torch.autograd.grad`` of the summed reward to that leaf. The
weights are frozen for the call (no weight gradient is formed, and no activation is kept
for one), so the backward costs about one more forward (docs/performance.md, section 2).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import torch

from credit_core import CreditError

Out = TypeVar("Out")


def unwrapped(model: Any) -> Any:
    """The module inside a DeepSpeed engine (its ``module``), or ``model`` itself."""
    inner = getattr(model, "module", None)
    return inner if isinstance(inner, torch.nn.Module) else model


@contextmanager
def frozen(module: torch.nn.Module) -> Iterator[None]:
    """Parameters of ``module`` with ``requires_grad`` False within the block (the input
    gradient then saves no activations for weight gradients); restored after it."""
    trainable = [p for p in module.parameters() if p.requires_grad]
    for p in trainable:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in trainable:
            p.requires_grad_(True)


def forward_with_input_grad(
    model: Any, forward: Callable[[], Out], reward_of: Callable[[Out], torch.Tensor]
) -> tuple[Out, torch.Tensor]:
    """``forward()`` (one forward of ``model``: a ``PreTrainedModel``, or the DeepSpeed
    engine holding one, called as its framework calls it) and dR/dx (B, L, d) in the model's
    dtype, R = ``reward_of(output)`` (B,), x the output of ``get_input_embeddings()``: 0
    where nothing reaches the reward. Grad is enabled (inference mode off) for the call;
    the caller detaches what it keeps of the output. ``CreditError`` unless the embeddings
    are computed exactly once."""
    out, _, grad = forward_with_input_and_grad(model, forward, reward_of)
    return out, grad


def forward_with_input_and_grad(
    model: Any, forward: Callable[[], Out], reward_of: Callable[[Out], torch.Tensor]
) -> tuple[Out, torch.Tensor, torch.Tensor]:
    """``forward_with_input_grad`` that also gives x (B, L, d), the input embeddings the
    forward read (the output of ``get_input_embeddings()``, detached, in the model's dtype):
    P2T's e_t (``credit_core.attribution``) of the same pass."""
    module = unwrapped(model)
    leaves: list[torch.Tensor] = []

    def as_leaf(_module: Any, _args: Any, output: torch.Tensor) -> torch.Tensor:
        leaf = output.detach().requires_grad_(True)
        leaves.append(leaf)
        return leaf

    handle = module.get_input_embeddings().register_forward_hook(as_leaf)
    try:
        with frozen(module), torch.inference_mode(False), torch.enable_grad():
            out = forward()
            if len(leaves) != 1:
                raise CreditError(
                    "reward model: expected one call of its input embeddings per forward, got "
                    f"{len(leaves)}"
                )
            (grad,) = torch.autograd.grad(reward_of(out).sum(), leaves[0], allow_unused=True)
    finally:
        handle.remove()
    x = leaves[0].detach()
    return out, x, torch.zeros_like(x) if grad is None else grad
