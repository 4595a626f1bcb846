"""OAR-G in the native trainer (docs/design.md, "Answer-gradient reweighting (OAR-G)"): the
task's answer span (``data.answer_span``), the extra policy pass taken only for a strategy
that reads ``answer_saliency``, and a run that trains with it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from backends.common.errors import ConfigError
from backends.torch.answer_span import AnswerSpan
from backends.torch.config import config_from_dict
from backends.torch.trainer import GRPORecipe, train
from tests.helpers.torch_tiny import tiny_config

pytestmark = pytest.mark.usefixtures("single_torch_thread")

EOS = 2


def test_the_answer_follows_the_first_marker_and_excludes_eos() -> None:
    span = AnswerSpan((EOS,), marker=9)
    ids = torch.tensor([[5, 6, 9, 7, 9, EOS, 0], [5, 6, 7, EOS, 0, 0, 0], [9, 4, EOS, 0, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 0, 0, 0, 0]])
    expected = torch.tensor(
        [[0, 0, 0, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0, 0], [0, 1, 0, 0, 0, 0, 0]]
    ).bool()
    assert torch.equal(span.mask(ids, mask.bool()), expected)


def test_the_answer_is_the_last_tokens_before_eos() -> None:
    span = AnswerSpan((EOS,), last=2)
    ids = torch.tensor([[5, 6, 7, 8, EOS, 0], [5, 6, 7, 8, 9, 4], [5, EOS, 0, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0]]).bool()
    expected = torch.tensor([[0, 0, 1, 1, 0, 0], [0, 0, 0, 0, 1, 1], [1, 0, 0, 0, 0, 0]]).bool()
    assert torch.equal(span.mask(ids, mask), expected)


def test_a_strategy_reading_the_answer_span_is_refused_at_start_up_without_one(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigError, match=r"data.answer_span.*'oar_g' reads each response's"):
        config_from_dict(tiny_config(tmp_path / "run", credit="oar_g"))
    with pytest.raises(ConfigError, match=r"data.answer_span.after: '= ='.* expected exactly one"):
        train(tiny_config(tmp_path / "r2", credit="oar_g", data={"answer_span": {"after": "= ="}}))


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, credit: Any) -> tuple[Any, list[int]]:
    from backends.torch import credit as credit_module

    calls: list[int] = []
    real = credit_module.answer_saliency

    def spy(*a: Any, **k: Any) -> Any:
        calls.append(int(a[1].shape[0]))
        return real(*a, **k)

    monkeypatch.setattr(credit_module, "answer_saliency", spy)
    cfg = tiny_config(
        tmp_path,
        steps=3,
        credit=credit,
        data={"answer_span": {"last": 2}},
        algorithm={"micro_batch_size": 4},
    )
    return train(cfg), calls


def test_oar_g_trains_on_a_task_with_an_answer_span(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, calls = _run(tmp_path / "oar_g", monkeypatch, {"name": "oar_g", "beta": 2.0})
    assert calls == [4, 4] * 3  # 2 prompts x G=4 rows, micro-batches of 4, 3 steps
    assert result.last_step == 3
    for record in result.history:
        assert math.isfinite(record["loss/policy"])
        assert record["credit/weight_max"] > 1.0 > record["credit/weight_min"] > 0.0
    _, none = _run(tmp_path / "uniform", monkeypatch, "uniform")
    assert none == []  # the answer span is context; the extra pass is oar_g's alone


def test_the_credit_keeps_each_responses_advantage_mean(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path / "run", credit="oar_g", data={"answer_span": {"last": 2}})
    recipe = GRPORecipe(config_from_dict(cfg))
    try:
        prompts, positions, groups = recipe._my_prompts(
            recipe.sampler.next_batch(), recipe.train_prompts
        )
        batch = recipe.rollout(prompts, positions, groups, group_size=4, greedy=False, tag="t")
        out = recipe.signals(batch, recipe.train_prompts)
        adv = out.credit.token_advantages.double()
        mask = batch.response_mask
        means = adv.sum(dim=1) / mask.sum(dim=1)
        torch.testing.assert_close(means, out.advantages.double(), rtol=1e-5, atol=1e-6)
        upweighted = (adv.abs() > out.advantages.double().abs().unsqueeze(1) + 1e-6) & mask
        assert bool(upweighted.any())
    finally:
        recipe.close()
