"""``process``: DeepSeekMath's process supervision on the user's token rewards mixed with the
outcome advantage (docs/design.md, "User-given token rewards (process supervision)").

A_t = outcome_weight A_i + process_weight sum_{k >= t, k given} (r_k - mean_g r) / (std_g r
+ eps), mean and std (Bessel) over the rewards given in the group; checked on a group worked
by hand, and by invariants: zero token rewards give GRPO's advantages bit for bit, a reward
at the last token only is GRPO's advantage on every token, rewards at every token are the
``step_norm`` route.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from credit_core import (
    CreditError,
    CreditSignals,
    TokenRewards,
    assign_credit,
    get_strategy,
    group_advantages,
)
from credit_core.plan import CreditPlan
from credit_core.token_rewards import critic_reward_shift, group_step_advantages
from tests.credit_core.test_plan import EVERYTHING

pytestmark = pytest.mark.usefixtures("single_torch_thread")

EPS = 1e-6
#: One group of three responses of 4, 3 and 2 tokens.
MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
IDS = torch.zeros(3, 4, dtype=torch.long)
GROUPS = torch.zeros(3, dtype=torch.long)
#: Two correct steps; a wrong step then a correct one; one wrong step.
SPANS = [[(0, 2, 1.0), (2, 4, 1.0)], [(0, 1, 0.0), (1, 3, 1.0)], [(0, 2, 0.0)]]


def _run(
    rewards: torch.Tensor, token_rewards: TokenRewards | None, **params: float
) -> torch.Tensor:
    adv = group_advantages(rewards, 3)
    signals = CreditSignals(token_rewards=token_rewards)
    return assign_credit(
        get_strategy("process", **params), adv, MASK, IDS, signals, rewards=rewards, groups=GROUPS
    ).token_advantages


def test_a_group_worked_by_hand() -> None:
    """Given rewards 1, 1 | 0, 1 | 0: mean 3/5, deviations 0.4, 0.4 | -0.6, 0.4 | -0.6, sum of
    squares 1.2, std sqrt(1.2 / 4) = sqrt(0.3). Sums to go (in units of 1 / s, s = sqrt(0.3)
    + eps): (0.8, 0.8, 0.4, 0.4), (-0.2, 0.4, 0.4), (-0.6, -0.6): the correct response's late
    tokens stay positive. Outcomes R = (2, 1, 0) (the sums): A_i = (1, 0, -1) / (1 + eps)."""
    tr = TokenRewards.from_spans(SPANS, MASK)
    R = torch.tensor([2.0, 1.0, 0.0])
    s = math.sqrt(0.3) + EPS
    process = (
        torch.tensor(
            [[0.8, 0.8, 0.4, 0.4], [-0.2, 0.4, 0.4, 0.0], [-0.6, -0.6, 0.0, 0.0]],
            dtype=torch.float64,
        )
        / s
    )
    torch.testing.assert_close(_run(R, tr), process.float())
    a = torch.tensor([1.0, 0.0, -1.0], dtype=torch.float64) / (1 + EPS)
    mixed = torch.where(MASK, 0.5 * a.unsqueeze(1) + 2.0 * process, 0.0)
    torch.testing.assert_close(_run(R, tr, outcome_weight=0.5, process_weight=2.0), mixed.float())


def test_under_a_critic_the_token_rewards_are_the_raw_given_ones_with_the_weights() -> None:
    tr = TokenRewards.from_spans(SPANS, MASK)
    R = torch.tensor([2.0, 1.0, 0.0])
    adv = group_advantages(R, 3)
    strategy = get_strategy("process", outcome_weight=0.5)
    assert strategy.critic_reward_form == "token_rewards"
    result = assign_credit(
        strategy, adv, MASK, IDS, CreditSignals(token_rewards=tr), rewards=R, groups=GROUPS
    )
    raw = torch.tensor([[0, 1, 0, 1], [0, 0, 1, 0], [0, 0, 0, 0]], dtype=torch.float64)
    last = torch.tensor([[0, 0, 0, 1], [0, 0, 1, 0], [0, 1, 0, 0]], dtype=torch.float64)
    expected = raw + 0.5 * R.double().unsqueeze(1) * last
    assert result.token_rewards is not None
    torch.testing.assert_close(result.token_rewards, expected)
    shift = critic_reward_shift(result, adv, R, GROUPS, MASK, "token_rewards")
    torch.testing.assert_close(
        shift.double() + R.double().unsqueeze(1) * last, expected.float().double()
    )


@given(seed=st.integers(0, 10_000))
@settings(max_examples=30, deadline=None)
def test_zero_token_rewards_give_grpo_s_advantages_bit_for_bit(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    R = torch.randn(3, generator=gen)
    spans = [[(0, 1, 0.0)], [], [(1, 2, 0.0)]]
    zero = TokenRewards.from_spans(spans, MASK)
    grpo = assign_credit(get_strategy("uniform"), group_advantages(R, 3), MASK, IDS)
    ours = _run(R, zero, outcome_weight=1.0)
    assert torch.equal(ours, grpo.token_advantages)


@given(seed=st.integers(0, 10_000))
@settings(max_examples=30, deadline=None)
def test_a_reward_at_the_last_token_only_is_grpo_s_advantage_on_every_token(seed: int) -> None:
    """DeepSeekMath's outcome supervision is process supervision with one step."""
    gen = torch.Generator().manual_seed(seed)
    R = torch.randn(3, generator=gen, dtype=torch.float64)
    spans = [[(0, int(n), float(r))] for n, r in zip(MASK.sum(1), R, strict=True)]
    ours = _run(R.float(), TokenRewards.from_spans(spans, MASK))
    grpo = group_advantages(R, 3, eps=EPS).unsqueeze(1).expand(3, 4)
    torch.testing.assert_close(ours, torch.where(MASK, grpo, 0.0).float())


@given(seed=st.integers(0, 10_000))
@settings(max_examples=30, deadline=None)
def test_rewards_at_every_token_are_the_step_norm_route(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    r = torch.where(MASK, torch.randn(3, 4, generator=gen, dtype=torch.float64), 0.0)
    rows = [r[i, MASK[i]].tolist() for i in range(3)]
    ours = _run(torch.randn(3, generator=gen), TokenRewards.from_dense(rows, MASK))
    assert torch.equal(ours, group_step_advantages(r, MASK, GROUPS))


def test_a_group_with_fewer_than_two_given_rewards_gets_no_process_credit() -> None:
    tr = TokenRewards.from_spans([[(0, 4, 3.0)], [], []], MASK)
    assert torch.equal(_run(torch.zeros(3), tr), torch.zeros(3, 4))


def test_the_signal_is_refused_where_it_is_not_read_and_required_where_it_is() -> None:
    tr = TokenRewards.from_spans(SPANS, MASK)
    R = torch.tensor([2.0, 1.0, 0.0])
    with pytest.raises(CreditError, match=r"'uniform' does not read token rewards"):
        assign_credit(get_strategy("uniform"), R, MASK, IDS, CreditSignals(token_rewards=tr))
    with pytest.raises(CreditError, match=r"CreditBatch.token_rewards is None"):
        _run(R, None)
    with pytest.raises(CreditError, match=r"outcome_weight and process_weight are both 0"):
        get_strategy("process", process_weight=0.0)


def test_rewards_given_at_padding_are_refused_naming_the_rows() -> None:
    tr = TokenRewards.from_spans([[], [], [(0, 1, 1.0)]], torch.ones(3, 4, dtype=torch.bool))
    shifted = TokenRewards(tr.values.roll(2, dims=1), tr.given.roll(2, dims=1))
    with pytest.raises(CreditError, match=r"token_rewards.given: .* rows \[2\]"):
        _run(torch.zeros(3), shifted)


def test_the_plan_reads_the_token_rewards_feature_and_a_backend_without_it_refuses() -> None:
    plan = CreditPlan.build("process", EVERYTHING)
    assert plan.features == {"groups", "token_rewards"} and plan.signals == frozenset()
    lacking = type(EVERYTHING)(
        "plain", "credit", EVERYTHING.signals, EVERYTHING.features - {"token_rewards"}, hint="h"
    )
    with pytest.raises(CreditError, match=r"token rewards the user's reward function gives"):
        CreditPlan.build("process", lacking)
