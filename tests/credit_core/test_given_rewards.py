"""The user's token rewards (``credit_core.given_rewards``): per-token rewards at every valid
token, per-step spans at their last token, a reward function's mixed outputs; every bad
item is one ``CreditError`` naming the response and the field."""

from __future__ import annotations

import math

import pytest
import torch

from credit_core import CreditError, TokenRewards, parse_reward_outputs

pytestmark = pytest.mark.usefixtures("single_torch_thread")

#: Three responses of 4, 3 and 2 valid tokens (right-padded to T = 4).
MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)


def test_dense_rewards_are_given_at_every_valid_token() -> None:
    tr = TokenRewards.from_dense(
        [[1.0, 2.0, 3.0, 4.0], [0.5, 0.0, -1.0], torch.tensor([2, 3])], MASK
    )
    assert tr.values.dtype == torch.float64
    assert torch.equal(tr.given, MASK)
    expected = [[1, 2, 3, 4], [0.5, 0, -1, 0], [2, 3, 0, 0]]
    assert torch.equal(tr.values, torch.tensor(expected, dtype=torch.float64))


def test_step_spans_put_each_reward_at_the_span_s_last_token() -> None:
    spans = [[(2, 4, 1.0), (0, 2, 0.5)], [(1, 3, -1.0)], []]
    tr = TokenRewards.from_spans(spans, MASK)
    given = [[0, 1, 0, 1], [0, 0, 1, 0], [0, 0, 0, 0]]
    assert torch.equal(tr.given, torch.tensor(given, dtype=torch.bool))
    values = [[0, 0.5, 0, 1], [0, 0, -1, 0], [0, 0, 0, 0]]
    assert torch.equal(tr.values, torch.tensor(values, dtype=torch.float64))


def test_positions_are_the_row_s_valid_tokens_in_order() -> None:
    left = torch.tensor([[0, 1, 1], [1, 1, 1]], dtype=torch.bool)  # left-padded row 0
    tr = TokenRewards.from_spans([[(0, 2, 3.0)], [(0, 1, 1.0)]], left)
    assert tr.given[0].tolist() == [False, False, True]
    assert tr.values[0, 2] == 3.0


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: TokenRewards.from_dense([[1.0] * 3, [0.0] * 3, [0.0] * 2], MASK),
            r"response 0: token_rewards: expected one reward per response token \(4\), got 3",
        ),
        (
            lambda: TokenRewards.from_dense([[1.0] * 4, [0.0, math.nan, 0.0], [0.0] * 2], MASK),
            r"response 1: token_rewards\[1\]: expected a finite number, got nan",
        ),
        (
            lambda: TokenRewards.from_spans([[], [], [(1, 3, 1.0)]], MASK),
            r"response 2: step_rewards\[0\]: expected integer positions 0 <= start < end <= 2",
        ),
        (
            lambda: TokenRewards.from_spans([[(0, 2, 1.0), (1, 3, 1.0)], [], []], MASK),
            r"response 0: step_rewards: spans 0 and 1 overlap",
        ),
        (
            lambda: TokenRewards.from_spans([[(2, 2, 1.0)], [], []], MASK),
            r"response 0: step_rewards\[0\]: expected integer positions",
        ),
        (
            lambda: TokenRewards.from_spans([[(0, 1, math.inf)], [], []], MASK),
            r"response 0: step_rewards\[0\]: reward: expected a finite number, got inf",
        ),
        (
            lambda: TokenRewards.from_spans([[(0, 1)], [], []], MASK),
            r"response 0: step_rewards\[0\]: expected \(start, end, reward\)",
        ),
        (lambda: TokenRewards.from_dense([[1.0] * 4], MASK), r"rows: expected 3"),
    ],
)
def test_bad_rewards_are_one_error_naming_the_response_and_the_field(
    build: object, message: str
) -> None:
    with pytest.raises(CreditError, match=message):
        build()  # type: ignore[operator]


def test_the_container_refuses_values_off_the_given_positions() -> None:
    with pytest.raises(CreditError, match=r"TokenRewards.values: .* rows \[1\]"):
        TokenRewards(
            torch.tensor([[0.0], [1.0]], dtype=torch.float64), torch.zeros(2, 1, dtype=torch.bool)
        )


def test_a_reward_function_s_outputs_give_the_outcome_and_the_token_rewards() -> None:
    outputs = [
        {"outcome": 1.0, "step_rewards": [(0, 2, 0.5), (2, 4, 1.0)]},
        [0.5, 0.0, -1.0],
        2.0,
    ]
    rewards, tr = parse_reward_outputs(outputs, MASK, name="fn")
    assert rewards.dtype == torch.float32 and rewards.tolist() == [1.0, -0.5, 2.0]
    assert tr is not None
    assert tr.given.tolist() == [
        [False, True, False, True],
        [True, True, True, False],
        [False, False, False, False],
    ]
    steps = parse_reward_outputs([[(0, 4, 2.0)], [], 1.0], MASK)[1]
    assert steps is not None and steps.values[0, 3] == 2.0 and not steps.given[1].any()


def test_numbers_only_give_no_token_rewards() -> None:
    rewards, tr = parse_reward_outputs([1.0, 0, torch.tensor(0.5)], MASK)
    assert tr is None and rewards.tolist() == [1.0, 0.0, 0.5]


@pytest.mark.parametrize(
    ("outputs", "message"),
    [
        ([1.0, 2.0], r"fn: expected 3 rewards \(one per response\), got 2"),
        ([1.0, math.nan, 0.0], r"fn: response 1: reward: expected a finite number, got nan"),
        ([1.0, {"outcome": 1.0}, 0.0], r"fn: response 1: expected a mapping with 'outcome'"),
        ([1.0, 0.0, [1.0, 2.0, 3.0]], r"fn: response 2: token_rewards: expected one reward per"),
        ([1.0, 0.0, "good"], r"fn: response 2: expected a list, got str"),
        (
            [{"outcome": math.inf, "token_rewards": [0.0] * 4}, 0.0, 0.0],
            r"fn: response 0: outcome: expected a finite number, got inf",
        ),
    ],
)
def test_bad_outputs_name_the_function_the_response_and_the_field(
    outputs: list[object], message: str
) -> None:
    with pytest.raises(CreditError, match=message):
        parse_reward_outputs(outputs, MASK, name="fn")


def test_select_pad_and_cat_keep_the_rows() -> None:
    tr = TokenRewards.from_spans([[(0, 4, 1.0)], [(0, 1, 2.0)], []], MASK)
    padded = tr.pad_to(6)
    assert padded.shape == (3, 6) and not padded.given[:, 4:].any()
    both = TokenRewards.cat([padded.select(slice(0, 1)), padded.select(slice(1, 3))])
    assert torch.equal(both.values, padded.values) and torch.equal(both.given, padded.given)
    with pytest.raises(CreditError, match=r"pad_to: expected a length >= T=4"):
        tr.pad_to(3)
