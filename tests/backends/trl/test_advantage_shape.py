"""TRL's own loss takes (B, T) token advantages: the contract backends/trl rests on.

``CreditGRPOTrainer`` hands TRL's ``GRPOTrainer._compute_loss`` a (B, T) ``advantages``
tensor. TRL accepts it today (it unsqueezes only a (B,) one) but keeps that path for
subclasses, and its maintainers have proposed removing the trainers that use it. These tests
call the installed TRL's *stock* loss, not this project's subclass, so they fail on the day a
TRL release stops weighting each token by its own advantage.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.backends.trl.conftest import make_trainer

B, P, T = 4, 5, 7


def _batch(vocab: int, advantages: torch.Tensor) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    completion_mask = torch.ones(B, T, dtype=torch.long)
    completion_mask[1, 4:] = 0  # ragged rows: padding must not count
    completion_mask[3, 2:] = 0
    return {
        "prompt_ids": torch.randint(3, vocab, (B, P), generator=gen),
        "prompt_mask": torch.ones(B, P, dtype=torch.long),
        "completion_ids": torch.randint(3, vocab, (B, T), generator=gen),
        "completion_mask": completion_mask,
        "advantages": advantages,
        "num_items_in_batch": completion_mask.sum(),
    }


def _grads(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def _stock_grads(trainer: Any, inputs: dict[str, Any]) -> list[torch.Tensor]:
    """Gradient of TRL's own ``GRPOTrainer._compute_loss`` on ``inputs``."""
    from trl import GRPOTrainer

    trainer.model.zero_grad()
    GRPOTrainer._compute_loss(trainer, trainer.model, inputs).backward()
    return _grads(trainer.model)


def _hand_grads(trainer: Any, inputs: dict[str, Any]) -> list[torch.Tensor]:
    """Gradient of the bnpo policy term at ratio 1, written out: -sum_bt A_bt m_bt log
    pi(y_bt) / sum_bt m_bt (its gradient is the clipped surrogate's when old = current)."""
    model = trainer.model
    model.zero_grad()
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    logits = model(input_ids=ids, attention_mask=attn).logits[:, P - 1 : -1]
    logp = torch.log_softmax(logits.float(), dim=-1)
    logp = logp.gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)
    mask = inputs["completion_mask"].float()
    (-(inputs["advantages"] * logp * mask).sum() / mask.sum()).backward()
    return _grads(model)


@pytest.fixture
def stock(task: Any, tokenizer: Any, tmp_path: Any) -> Any:
    trainer = make_trainer(task, tokenizer, tmp_path, stock=True, loss_type="bnpo", beta=0.0)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by transformers' training loop
    return trainer


def test_stock_loss_weights_each_token_by_its_own_advantage(stock: Any, tokenizer: Any) -> None:
    advantages = torch.randn(B, T, generator=torch.Generator().manual_seed(1))
    inputs = _batch(len(tokenizer), advantages)
    for got, want in zip(_stock_grads(stock, inputs), _hand_grads(stock, inputs), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_a_constant_row_of_token_advantages_is_the_response_advantage(
    stock: Any, tokenizer: Any
) -> None:
    A = torch.tensor([1.0, -0.5, 2.0, -1.5])
    per_response = _stock_grads(stock, _batch(len(tokenizer), A))
    per_token = _stock_grads(stock, _batch(len(tokenizer), A[:, None].expand(B, T).contiguous()))
    for got, want in zip(per_token, per_response, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
