"""The ``arithmetic`` task: disjoint held-out sums, the exact check, the TRL rows."""

from __future__ import annotations

import json
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.common.arithmetic import (
    ArithmeticParams,
    answer_of,
    arithmetic_prompts,
    exact_answer,
    trl_exact_answer,
    trl_records,
)
from backends.common.errors import ConfigError
from backends.common.tasks import get_task, task_problems
from tests.helpers.paths import REPO

_QUESTION = re.compile(r"^What is (\d+) \+ (\d+)\? Answer with the number only\.$")


def _operands(text: str) -> tuple[int, int]:
    match = _QUESTION.match(text)
    assert match is not None, text
    return int(match[1]), int(match[2])


@st.composite
def _params(draw: st.DrawFn) -> ArithmeticParams:
    low = draw(st.integers(0, 20))
    high = draw(st.integers(low + 1, low + 12))
    span = high - low + 1
    held = draw(st.integers(1, span * (span - 1) // 2))
    num = draw(st.none() | st.integers(1, span * span - 2 * held))
    return ArithmeticParams(
        low=low, high=high, num_eval_prompts=held, num_prompts=num, seed=draw(st.integers(0, 9))
    )


@settings(max_examples=60, deadline=None)
@given(_params())
def test_no_training_prompt_asks_a_held_out_pair_in_either_order(params: ArithmeticParams) -> None:
    train, held_out = arithmetic_prompts(params)
    span = params.high - params.low + 1
    assert len(held_out) == params.num_eval_prompts
    expected = span * span - 2 * params.num_eval_prompts
    assert len(train) == (expected if params.num_prompts is None else params.num_prompts)
    asked = [_operands(p.text) for p in train]
    assert len(set(asked)) == len(asked)  # every training pair once
    held = [_operands(p.text) for p in held_out]
    assert all(a != b for a, b in held)
    assert not {frozenset(pair) for pair in held} & {frozenset(pair) for pair in asked}
    for prompt in [*train, *held_out]:
        a, b = _operands(prompt.text)
        assert params.low <= min(a, b) and max(a, b) <= params.high
        assert prompt.label == a + b


def test_the_prompts_depend_on_the_seed_alone() -> None:
    assert arithmetic_prompts(ArithmeticParams()) == arithmetic_prompts(ArithmeticParams())
    assert arithmetic_prompts(ArithmeticParams(seed=1)) != arithmetic_prompts(ArithmeticParams())


@pytest.mark.parametrize(
    ("response", "answer"),
    [
        ("8", 8),
        ("5 + 3 = 8.", 8),
        ("The answer is 12.", 12),
        ("9 + 8 = 15.", 15),  # wrong, but what it answered
        ("-3", -3),
        ("I cannot say.", None),
        ("", None),
    ],
)
def test_the_answer_is_the_last_integer_written(response: str, answer: int | None) -> None:
    assert answer_of(response) == answer


def test_the_exact_check_scores_one_for_the_sum_and_zero_otherwise() -> None:
    responses = ["3 + 4 = 7.", "3 + 4 = 8.", "seven", "The sum is 7"]
    assert exact_answer([""] * 4, responses, [7, 7, 7, 7]) == [1.0, 0.0, 0.0, 1.0]
    with pytest.raises(ConfigError, match="one label per response, got 1 labels for 2"):
        exact_answer(["", ""], ["7", "7"], [7])


def test_the_trl_reward_reads_string_and_conversational_completions() -> None:
    chat = [
        [{"role": "assistant", "content": "2 + 2 = 4."}],
        [{"role": "assistant", "content": "5"}],
    ]
    assert trl_exact_answer([[], []], chat, answer=[4, 4], extra_column=[0, 0]) == [1.0, 0.0]
    assert trl_exact_answer(["p"], ["It is 11"], answer=[11]) == [1.0]


def test_the_committed_trl_files_are_the_tasks_prompts() -> None:
    train, held_out = arithmetic_prompts(ArithmeticParams())
    folder = REPO / "configs" / "trl" / "data"
    for name, prompts in (("train", train), ("eval", held_out)):
        lines = (folder / f"arithmetic_{name}.jsonl").read_text().splitlines()
        assert [json.loads(line) for line in lines] == trl_records(prompts)


def test_the_task_is_built_in_and_asks_the_config_for_its_reward() -> None:
    task = get_task("arithmetic", {}, vocab_size=49152)
    assert (len(task.train_prompts), len(task.eval_prompts)) == (49, 16)
    with pytest.raises(ConfigError, match=r"reward\.reward: \{kind: callable, function: "):
        task.build_direction(torch.device("cpu"))


@pytest.mark.parametrize(
    ("params", "field", "message"),
    [
        ({"low": 5, "high": 5}, "task_params", "high (5) must be > low (5)"),
        ({"num_eval_prompts": 37}, "task_params.num_eval_prompts", "exceeds the 36 pairs"),
        ({"num_prompts": 50}, "task_params.num_prompts", "exceeds the 49 ordered pairs"),
        ({"operands": 3}, "task_params.operands", "unknown key (allowed keys: high, low"),
    ],
)
def test_bad_parameters_are_named(params: dict[str, int], field: str, message: str) -> None:
    (problem,) = task_problems("arithmetic", params)
    assert problem.field == field
    assert message in problem.message
