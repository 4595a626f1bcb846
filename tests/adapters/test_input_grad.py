"""``forward_with_input_grad``: the reward's gradient at the input embeddings from the
model's own call, against autograd on ``inputs_embeds``; weights left as they were."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from adapters.input_grad import forward_with_input_grad
from adapters.tiny import tiny_seq_classifier
from credit_core import CreditError


def test_the_gradient_is_autograds_on_the_input_embeddings() -> None:
    rm = tiny_seq_classifier("llama", 40, pad_token_id=0)
    ids = torch.randint(1, 40, (3, 5), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():  # as the frameworks call their reward models
        out, grad = forward_with_input_grad(
            rm, lambda m: m(input_ids=ids), lambda o: o.logits[:, 0]
        )
    x = rm.get_input_embeddings()(ids).detach().requires_grad_(True)
    logits = rm(inputs_embeds=x).logits[:, 0]
    (expected,) = torch.autograd.grad(logits.sum(), x)
    torch.testing.assert_close(grad, expected)
    torch.testing.assert_close(out.logits[:, 0].detach(), logits.detach())
    assert all(p.requires_grad and p.grad is None for p in rm.parameters())


def test_a_model_that_embeds_twice_is_refused() -> None:
    rm = tiny_seq_classifier("llama", 40, pad_token_id=0)
    ids = torch.ones(1, 3, dtype=torch.long)

    def twice(module: torch.nn.Module) -> Any:
        module(input_ids=ids)
        return module(input_ids=ids)

    with pytest.raises(CreditError, match="one call of its input embeddings"):
        forward_with_input_grad(rm, twice, lambda o: o.logits[:, 0])
    assert all(p.requires_grad for p in rm.parameters())
