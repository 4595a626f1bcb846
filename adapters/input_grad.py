"""A reward model's output and its reward's gradient at its input embeddings, from one
forward and one backward of the model as its framework calls it.

The frameworks' own reward passes (TRL's ``_calculate_rewards``, OpenRLHF's reward actors)
call the model on token ids, under ``no_grad`` / ``inference_mode``. To get DATC's reward
gradient from that same pass, ``forward_with_input_grad`` runs the framework's call with
gradients on, a forward hook on the model's input-embedding module making its output
E[ids] a leaf, and one ``torch.autograd.grad`` of the summed reward to that leaf. The
weights are frozen for the call (no weight gradient is formed, and no activation is kept
for one), so the backward costs about one more forward (docs/performance.md, section 2).

Both frameworks may hold the reward model in a DeepSpeed engine (TRL's ``prepare_deepspeed``
under any DeepSpeed config, OpenRLHF's eval engine). The engine's own ``forward`` hooks its
outputs for ``engine.backward``: a backward it does not run is refused outright where the
engine holds no ZeRO optimizer (ZeRO-3's parameter offload, stage 0 in fp32), and otherwise
enters the engine's training backward, which divides the output gradient by
``gradient_accumulation_steps`` (stage 0 in bf16: measured, dR/dx came out 1/GAS). The call
is therefore made on the module inside the engine, under the autocast the engine's forward
would enter (its ``torch_autocast`` config), which is all an eval forward of the engine adds
around its module, so the output is bitwise the engine's. Under ZeRO-3 the module's own
hooks, installed by DeepSpeed on every submodule, all-gather its partitioned weights in the
forward and again in the backward (their pre-backward function sits on every submodule
output that needs a gradient, here the activations downstream of the embedding leaf), so
the pass is a collective every process must enter, as the stock forward is; the engine's
``empty_partition_cache`` afterwards releases what the backward left gathered (measured
with OpenRLHF's reward model: it stayed whole otherwise; TRL's tiny test model was
released either way).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, TypeVar

import torch

from adapters.partitioned import holds_zero3_params
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


def engine_autocast(model: Any) -> AbstractContextManager[Any]:
    """The autocast a DeepSpeed engine ``model`` enters around its module in ``forward``
    (``deepspeed.runtime.torch_autocast.autocast_if_enabled``: its ``torch_autocast``
    config), or nothing for a model that is no engine."""
    if not callable(getattr(model, "torch_autocast_enabled", None)):
        return nullcontext()
    from deepspeed.runtime.torch_autocast import autocast_if_enabled

    return autocast_if_enabled(model)  # type: ignore[no-any-return]


def forward_with_input_grad(
    model: Any,
    forward: Callable[[torch.nn.Module], Out],
    reward_of: Callable[[Out], torch.Tensor],
) -> tuple[Out, torch.Tensor]:
    """``forward(module)`` (one forward of ``module``, the ``PreTrainedModel`` that ``model``
    is or that the DeepSpeed engine ``model`` holds, called as its framework calls the model;
    under the engine's autocast) and dR/dx (B, L, d) in the model's dtype, R =
    ``reward_of(output)`` (B,), x the output of ``get_input_embeddings()``: 0 where nothing
    reaches the reward. Grad is enabled (inference mode off) for the call; the caller
    detaches what it keeps of the output. Under ZeRO-3 a collective (module docstring), the
    engine's gathered weights released after it. ``CreditError`` unless the embeddings are
    computed exactly once."""
    out, _, grad = forward_with_input_and_grad(model, forward, reward_of)
    return out, grad


def forward_with_input_and_grad(
    model: Any,
    forward: Callable[[torch.nn.Module], Out],
    reward_of: Callable[[Out], torch.Tensor],
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
            with engine_autocast(model):
                out = forward(module)
            if len(leaves) != 1:
                raise CreditError(
                    "reward model: expected one call of its input embeddings per forward, got "
                    f"{len(leaves)}"
                )
            (grad,) = torch.autograd.grad(reward_of(out).sum(), leaves[0], allow_unused=True)
    finally:
        handle.remove()
    if model is not module and holds_zero3_params([module]):
        model.empty_partition_cache()  # the backward's gathers stay whole otherwise
    x = leaves[0].detach()
    return out, x, torch.zeros_like(x) if grad is None else grad
