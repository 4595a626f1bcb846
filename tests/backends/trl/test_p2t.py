"""P2T under TRL (real TRL 1.16, CPU, tiny Llama; docs/design.md, "Gradient x input
attribution (P2T)"): the credit reads ``reward_attribution`` alone, computed from the reward
gradient of the direction model's one scoring pass as r_t = (E[y_t] - e_null) . g_t; no
policy statistics are reduced; a null the direction model lacks is refused when the trainer
is built, naming it. The paper form (token rewards turned into advantages within the
step's groups) trains too: TRL forms a group-reading strategy's credit at generation time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import backends.common.credit as credit_module
import backends.trl.trainer as trainer_module
from backends.trl.tasks import TaskData
from credit_core import CreditError
from tests.backends.trl.conftest import make_trainer


@pytest.mark.parametrize(
    "credit", ["p2t", {"name": "p2t", "null": "zero"}, {"name": "p2t", "mode": "paper"}]
)
def test_p2t_trains_on_the_attribution_of_the_reward_gradient(
    task: TaskData, tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, credit: Any
) -> None:
    passed: list[Any] = []
    real = credit_module.assign_credit

    def spy(strategy: Any, *args: Any, **kwargs: Any) -> Any:
        passed.append(args[3])
        return real(strategy, *args, **kwargs)

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("policy statistics were reduced")

    monkeypatch.setattr(credit_module, "assign_credit", spy)
    monkeypatch.setattr(trainer_module, "policy_stats", refused)
    monkeypatch.setattr(trainer_module, "unsigned_work", refused)
    trainer = make_trainer(task, tokenizer, tmp_path, credit=credit)
    dm = trainer.direction
    seen: list[tuple[torch.Tensor, ...]] = []
    real_attribution = dm.attribution

    def attribution(grad: Any, ids: Any, mask: Any, kind: str) -> torch.Tensor:
        out = real_attribution(grad, ids, mask, kind)
        seen.append((grad, ids, mask.bool(), out))
        return out

    monkeypatch.setattr(dm, "attribution", attribution)
    assert trainer.credit_phase == "generation" and trainer._capture is None
    trainer.train()
    assert passed and all(s.computed == {"reward_attribution"} for s in passed)
    assert len(seen) == len(passed)
    null = trainer.strategy.attribution_null
    e_null = dm.null_embedding(null)
    for (grad, ids, mask, r), signals in zip(seen, passed, strict=True):
        expected = torch.where(mask, ((dm.reward_embedding[ids] - e_null) * grad).sum(-1), 0.0)
        torch.testing.assert_close(r, expected, atol=1e-6, rtol=1e-5)
        assert signals.reward_attribution is r
    logs = [r for r in trainer.state.log_history if "credit/weight_max" in r]
    assert logs and all(v == v for r in logs for v in r.values())


def test_a_null_the_direction_model_lacks_is_refused_when_built(
    task: TaskData, tokenizer: Any, tmp_path: Path
) -> None:
    with pytest.raises(
        CreditError, match=r"^credit: strategy 'p2t' reads reward_attribution: null: 'unk'"
    ):
        make_trainer(task, tokenizer, tmp_path, credit={"name": "p2t", "null": "unk"})
