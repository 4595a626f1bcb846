"""``credit: process`` through TRL's own trainer path (real TRL 1.16, CPU, tiny Llama): a
reward function returning per-step spans gives TRL the outcome and the credit the token
rewards on TRL's completion tokens; the token advantages TRL buffers for its loss are the
hand formula (docs/design.md, "User-given token rewards (process supervision)"); a bad
length is one ``CreditError`` naming the function and the completion."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from trl import GRPOTrainer

from backends.trl import CreditGRPOTrainer
from backends.trl.tasks import TaskData
from backends.trl.token_rewards import completion_mask
from credit_core import CreditError
from tests.backends.trl.conftest import make_trainer
from tests.helpers.process_formula import halves, halves_process

#: GRPO's std floor in TRL's advantage.
TRL_EPS = 1e-4
GROUP = 4


spans_of = halves


def step_reward(completion_ids: list[list[int]], **kwargs: Any) -> list[Any]:
    """TRL's reward-function signature; the outcome and the step spans of each completion."""
    return [
        {"outcome": sum(r for _, _, r in spans_of(ids)), "step_rewards": spans_of(ids)}
        for ids in completion_ids
    ]


def hand_formula(ids: torch.Tensor, mask: torch.Tensor, weight: float) -> torch.Tensor:
    """A (B, T): ``process`` on TRL's GRPO advantage (tests/helpers/process_formula.py)."""
    return halves_process(ids, mask, GROUP, weight, TRL_EPS)[1]


def test_step_rewards_reach_trls_loss_as_the_hand_formula(
    task: TaskData, tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches: list[dict[str, Any]] = []
    real = CreditGRPOTrainer._generate_and_score_completions

    def spy(self: Any, inputs: Any) -> dict[str, Any]:
        out = real(self, inputs)
        batches.append(out)
        return out

    seen: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    loss = GRPOTrainer._compute_loss

    def loss_spy(self: Any, model: Any, inputs: dict[str, Any]) -> Any:
        seen.append((inputs["prompt_ids"], inputs["completion_ids"], inputs["advantages"]))
        return loss(self, model, inputs)

    monkeypatch.setattr(CreditGRPOTrainer, "_generate_and_score_completions", spy)
    monkeypatch.setattr(GRPOTrainer, "_compute_loss", loss_spy)
    credit = {"name": "process", "outcome_weight": 0.5}
    trainer = make_trainer(
        task,
        tokenizer,
        tmp_path,
        credit=credit,
        reward_funcs=step_reward,
        max_steps=1,
        per_device_train_batch_size=8,
        max_completion_length=8,
    )
    trainer.train()
    assert trainer.credit_phase == "generation" and len(batches) == 1
    out = batches[0]
    mask = out["completion_mask"].bool()
    expected = hand_formula(out["completion_ids"], mask, 0.5)
    assert out["advantages"].shape == mask.shape
    torch.testing.assert_close(out["advantages"].double(), expected, atol=1e-5, rtol=1e-5)
    assert bool((out["advantages"][~mask] == 0).all())
    assert float(expected.abs().sum()) > 0 and bool((expected * mask < 0).any())
    # TRL's loss read those rows' token advantages (its micro-batches shuffle the rows)
    rows = [
        (p, c, a) for prompts, ids, adv in seen for p, c, a in zip(prompts, ids, adv, strict=True)
    ]
    assert len(rows) == mask.shape[0]
    for p, c, a in rows:
        same = (out["prompt_ids"] == p).all(dim=1) & (out["completion_ids"] == c).all(dim=1)
        assert any(torch.equal(a, out["advantages"][i]) for i in torch.nonzero(same).flatten())
    # TRL took the outcome (the sum of each completion's step rewards) as its reward
    outcome = [
        sum(r for _, _, r in spans_of(ids[m].tolist()))
        for ids, m in zip(out["completion_ids"], mask, strict=True)
    ]
    logged = trainer.state.log_history[0]["reward"]
    assert logged == pytest.approx(sum(outcome) / len(outcome))


def test_a_bad_length_is_one_error_naming_the_completion(
    task: TaskData, tokenizer: Any, tmp_path: Path
) -> None:
    def short(completion_ids: list[list[int]], **kwargs: Any) -> list[Any]:
        return [[1.0] * (len(ids) - (i == 1)) for i, ids in enumerate(completion_ids)]

    trainer = make_trainer(
        task, tokenizer, tmp_path, credit="process", reward_funcs=short, max_steps=1
    )
    with pytest.raises(CreditError, match=r"reward function 'short': response 1: token_rewards: "):
        trainer.train()


def test_the_completion_mask_is_each_completions_tokens() -> None:
    mask = completion_mask([[5, 6, 7], [], [8]])
    assert mask.tolist() == [[True, True, True], [False] * 3, [True, False, False]]
