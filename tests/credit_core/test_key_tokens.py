"""KTAE (docs/design.md, "Key tokens (KTAE)").

- Fisher's two-sided p-value (lgamma hypergeometric, vectorised) is ``scipy.stats.fisher_exact``.
- The information gain is H(Y) - H(Y | X) in bits, written out.
- The strategy's A_t = A_i + k_{y_t} equals a brute-force loop over groups and token ids
  that builds each table with Python sets, scores it with scipy, and adds the score.
- A group with one outcome only keeps A_t = A_i (counted); padding gets 0; group ids are
  arbitrary and rows of a group need not be adjacent.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import fisher_exact

from credit_core import CreditError, assign_credit, get_strategy
from credit_core.key_tokens import fisher_exact_two_sided, information_gain

pytestmark = pytest.mark.usefixtures("single_torch_thread")

SETTINGS = settings(max_examples=30, deadline=None)

#: Hand-built tables [[a, b], [c, d]]: balanced, one-sided, zero cells, ties at the mode.
TABLES = [
    (3, 0, 0, 5),
    (0, 4, 4, 0),
    (2, 2, 2, 2),
    (1, 3, 3, 1),
    (5, 1, 0, 2),
    (0, 0, 4, 4),
    (4, 4, 0, 0),
    (1, 0, 7, 8),
    (6, 2, 2, 6),
    (10, 3, 2, 15),
    (0, 1, 1, 0),
    (2, 1, 2, 3),
]


def test_fisher_p_value_is_scipys_on_hand_built_tables() -> None:
    a, b, c, d = (torch.tensor([t[i] for t in TABLES]) for i in range(4))
    got = fisher_exact_two_sided(a, b, c, d)
    expected = torch.tensor(
        [fisher_exact([[t[0], t[1]], [t[2], t[3]]]).pvalue for t in TABLES], dtype=torch.float64
    )
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-12)


@given(cells=st.lists(st.integers(0, 12), min_size=4, max_size=4))
@SETTINGS
def test_fisher_p_value_is_scipys_on_random_tables(cells: list[int]) -> None:
    a, b, c, d = (torch.tensor([x]) for x in cells)
    got = float(fisher_exact_two_sided(a, b, c, d)[0])
    assert got == pytest.approx(fisher_exact([cells[:2], cells[2:]]).pvalue, rel=1e-9, abs=1e-12)


def _entropy(*counts: float) -> float:
    total = sum(counts)
    return -sum(x / total * math.log2(x / total) for x in counts if x > 0) if total else 0.0


def test_information_gain_is_h_y_minus_h_y_given_x() -> None:
    a, b, c, d = (torch.tensor([t[i] for t in TABLES]) for i in range(4))
    got = information_gain(a, b, c, d)
    expected = []
    for ta, tb, tc, td in TABLES:
        n = ta + tb + tc + td
        h_y_x = ((ta + tb) / n) * _entropy(ta, tb) + ((tc + td) / n) * _entropy(tc, td)
        expected.append(_entropy(ta + tc, tb + td) - h_y_x)
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64))
    assert float(got[0]) == pytest.approx(_entropy(3, 5))  # presence decides the outcome


def _tf(count: float, length: float, mean_length: float, k1: float = 2.0, b: float = 0.5) -> float:
    f = count / length
    return f * (k1 + 1) / (f + k1 * (1 - b + b * length / mean_length))


def brute_force_ktae(
    ids: torch.Tensor,
    mask: torch.Tensor,
    adv: torch.Tensor,
    rewards: torch.Tensor,
    groups: list[int],
    *,
    tf: bool = True,
    threshold: float = 0.0,
) -> torch.Tensor:
    """The module docstring's formula with Python loops and scipy, float64."""
    B, T = ids.shape
    out = torch.zeros(B, T, dtype=torch.float64)
    for g in set(groups):
        rows = [i for i in range(B) if groups[i] == g]
        correct = [i for i in rows if float(rewards[i]) > threshold]
        wrong = [i for i in rows if float(rewards[i]) <= threshold]
        tokens = {i: [int(ids[i, t]) for t in range(T) if mask[i, t]] for i in rows}
        score: dict[int, float] = {}
        for v in {v for i in rows for v in tokens[i]}:
            if not correct or not wrong:
                score[v] = 0.0
                continue
            a = sum(v in tokens[i] for i in correct)
            b = sum(v in tokens[i] for i in wrong)
            c, d = len(correct) - a, len(wrong) - b
            p = fisher_exact([[a, b], [c, d]]).pvalue
            fisher = math.exp(-2 * p) if p < 1 - 1e-9 else 0.0
            n = a + b + c + d
            gain = _entropy(a + c, b + d) - (
                (a + b) / n * _entropy(a, b) + (c + d) / n * _entropy(c, d)
            )
            x = math.asin(math.sqrt(a / len(correct))) - math.asin(math.sqrt(b / len(wrong)))
            if tf:
                len_c = sum(len(tokens[i]) for i in correct)
                len_w = sum(len(tokens[i]) for i in wrong)
                mean = (len_c + len_w) / 2
                tf_c = _tf(sum(tokens[i].count(v) for i in correct), len_c, mean)
                tf_w = _tf(sum(tokens[i].count(v) for i in wrong), len_w, mean)
                x += tf_c / (tf_w + 1e-5) - tf_w / (tf_c + 1e-5)
            s = (fisher + gain) * x / 2
            score[v] = math.tanh(s / 2)  # = 2 sigmoid(s) - 1
        for i in rows:
            for t in range(T):
                if mask[i, t]:
                    out[i, t] = float(adv[i]) + score[int(ids[i, t])]
    return out


def random_groups(seed: int, groups: int = 3, size: int = 5, T: int = 8, vocab: int = 6):
    gen = torch.Generator().manual_seed(seed)
    B = groups * size
    ids = torch.randint(0, vocab, (B, T), generator=gen)
    mask = torch.rand(B, T, generator=gen) < 0.8
    mask[:, 0] = True
    rewards = (torch.rand(B, generator=gen) < 0.5).to(torch.float64)
    rewards[size : 2 * size] = 1.0  # one group all correct: no contrast
    adv = torch.randn(B, generator=gen, dtype=torch.float64)
    order = torch.randperm(B, generator=gen)  # rows of a group need not be adjacent
    group_ids = (torch.arange(B) // size * 7 + 3)[order]  # arbitrary ids
    return ids[order], mask[order], adv[order], rewards[order], group_ids


@given(seed=st.integers(0, 10_000), tf=st.booleans())
@SETTINGS
def test_ktae_is_the_brute_force_loop(seed: int, tf: bool) -> None:
    ids, mask, adv, rewards, groups = random_groups(seed)
    strategy = get_strategy("ktae", tf=tf)
    result = assign_credit(strategy, adv, mask, ids, rewards=rewards, groups=groups)
    expected = brute_force_ktae(ids, mask, adv, rewards, groups.tolist(), tf=tf)
    torch.testing.assert_close(result.token_advantages, expected.float(), rtol=1e-5, atol=1e-6)
    assert bool((result.token_advantages[~mask] == 0).all())
    one_sided = 0
    for g in set(groups.tolist()):
        outcomes = {
            bool(r > 0) for r, h in zip(rewards.tolist(), groups.tolist(), strict=True) if h == g
        }
        one_sided += len(outcomes) == 1 and int((groups == g).sum())
    assert result.diagnostics.uniform_fallbacks == one_sided


def test_a_group_with_one_outcome_keeps_the_response_advantage() -> None:
    ids = torch.tensor([[1, 2, 3], [1, 2, 2], [4, 5, 6], [4, 1, 6]])
    mask = torch.ones(4, 3, dtype=torch.bool)
    adv = torch.tensor([0.5, -0.5, 0.3, -0.3], dtype=torch.float64)
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0], dtype=torch.float64)
    groups = torch.tensor([0, 0, 1, 1])
    result = assign_credit(get_strategy("ktae"), adv, mask, ids, rewards=rewards, groups=groups)
    torch.testing.assert_close(result.token_advantages[:2], adv[:2, None].float().expand(2, 3))
    assert result.diagnostics.uniform_fallbacks == 2
    # group 1: token 5 only in the correct response, token 1 only in the incorrect one
    got = result.token_advantages[2:]
    assert float(got[0, 1]) > 0.3 and float(got[1, 1]) < -0.3
    # tokens 4 and 6 are in both: equal shares, Fisher p = 1, IG = 0: k = 0
    assert float(got[0, 0]) == pytest.approx(0.3) and float(got[1, 2]) == pytest.approx(-0.3)


def test_threshold_decides_correctness_for_a_non_binary_reward() -> None:
    ids = torch.tensor([[1, 2], [3, 2]])
    mask = torch.ones(2, 2, dtype=torch.bool)
    adv = torch.zeros(2, dtype=torch.float64)
    rewards = torch.tensor([0.8, 0.4], dtype=torch.float64)
    groups = torch.tensor([0, 0])
    above = assign_credit(
        get_strategy("ktae", threshold=0.5), adv, mask, ids, rewards=rewards, groups=groups
    )
    assert float(above.token_advantages[0, 0]) > 0 > float(above.token_advantages[1, 0])
    none = assign_credit(get_strategy("ktae"), adv, mask, ids, rewards=rewards, groups=groups)
    assert bool((none.token_advantages == 0).all())  # both > 0: one outcome only


def test_ktae_needs_rewards_and_groups_and_valid_params() -> None:
    ids = torch.tensor([[1, 2]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(CreditError, match=r"CreditBatch\.rewards is None"):
        assign_credit(get_strategy("ktae"), torch.zeros(1), mask, ids)
    with pytest.raises(CreditError, match="alpha"):
        get_strategy("ktae", alpha=0.0, beta=0.0)
    with pytest.raises(CreditError, match="tf"):
        get_strategy("ktae", tf=1)
    assert get_strategy("ktae").reads_groups
