"""credit_core.agreement_gate: the direction model's within-group agreement with the reward,
and the gate that mixes token credit toward GRPO (docs/design.md, "Trusting the direction
model")."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import spearmanr

from credit_core import CreditError
from credit_core.agreement_gate import (
    Agreement,
    AgreementGate,
    GateConfig,
    direction_agreement,
    gate_token_advantages,
)


def _brute_force(scores: list[float], rewards: list[float], groups: list[int]) -> Agreement:
    """Mean over groups of scipy's Spearman rho; constant reward skipped, constant scores 0."""
    rhos, skipped = [], 0
    for g in sorted(set(groups)):
        s = [x for x, h in zip(scores, groups, strict=True) if h == g]
        r = [x for x, h in zip(rewards, groups, strict=True) if h == g]
        if len(set(r)) < 2:
            skipped += 1
        elif len(set(s)) < 2:
            rhos.append(0.0)
        else:
            rhos.append(float(spearmanr(s, r).statistic))
    return Agreement(float(np.mean(rhos)) if rhos else math.nan, len(rhos), skipped)


@settings(max_examples=60, deadline=None)
@given(
    data=st.lists(
        st.tuples(st.integers(0, 4), st.sampled_from([0.0, 0.5, 1.0]), st.integers(-3, 3)),
        min_size=1,
        max_size=24,
    )
)
def test_agreement_is_the_mean_within_group_spearman(data: list[tuple[int, float, int]]) -> None:
    groups = [g for g, _, _ in data]
    rewards = [r for _, r, _ in data]
    scores = [float(s) for _, _, s in data]  # few values: ties in both
    got = direction_agreement(torch.tensor(scores), torch.tensor(rewards), torch.tensor(groups))
    want = _brute_force(scores, rewards, groups)
    assert (got.groups, got.skipped) == (want.groups, want.skipped)
    if want.groups:
        assert got.value == pytest.approx(want.value, abs=1e-12)
    else:
        assert math.isnan(got.value)


def test_a_perfect_and_a_reversed_direction_model() -> None:
    rewards = torch.tensor([0.0, 1.0, 2.0, 3.0, 1.0, 0.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    assert direction_agreement(rewards * 5, rewards, groups).value == pytest.approx(1.0)
    assert direction_agreement(-rewards, rewards, groups).value == pytest.approx(-1.0)


def test_bad_inputs_are_named() -> None:
    s, r, g = torch.zeros(4), torch.zeros(4), torch.zeros(4, dtype=torch.long)
    with pytest.raises(CreditError, match="rewards: expected shape"):
        direction_agreement(s, torch.zeros(3), g)
    with pytest.raises(CreditError, match="groups: expected an integer dtype"):
        direction_agreement(s, r, g.float())
    with pytest.raises(CreditError, match="scores: expected finite"):
        direction_agreement(torch.tensor([0.0, math.nan, 0.0, 0.0]), r, g)


def _weights(raw: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Non-negative weights with mean 1 over each row's valid tokens."""
    w = raw.abs() * mask
    return w * mask.sum(1, keepdim=True) / w.sum(1, keepdim=True).clamp_min(1e-12)


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    alpha=st.floats(0.0, 1.0),
    rows=st.integers(1, 6),
    cols=st.integers(1, 9),
)
def test_the_gate_keeps_sign_and_per_response_mean(
    seed: int, alpha: float, rows: int, cols: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(rows, cols, generator=gen) < 0.8
    mask[:, 0] = True
    A = torch.randn(rows, generator=gen, dtype=torch.float64)
    w = _weights(torch.rand(rows, cols, generator=gen, dtype=torch.float64) + 0.01, mask)
    gated = gate_token_advantages(A[:, None] * w, A, mask, alpha)
    n = mask.sum(1)
    torch.testing.assert_close(gated.sum(1) / n, A, rtol=1e-12, atol=1e-12)
    assert bool((gated[mask] * A[:, None].expand_as(mask)[mask] >= 0).all())
    assert bool((gated[~mask] == 0).all())


def test_alpha_one_is_the_strategy_bit_for_bit_and_alpha_zero_is_grpo() -> None:
    mask = torch.tensor([[True, True, False], [True, True, True]])
    A = torch.tensor([1.5, -0.5])
    a = torch.tensor([[2.0, 1.0, 0.0], [-1.0, -0.25, -0.25]])
    assert gate_token_advantages(a, A, mask, 1.0) is a
    torch.testing.assert_close(
        gate_token_advantages(a, A, mask, 0.0), torch.where(mask, A[:, None], 0.0)
    )
    torch.testing.assert_close(
        gate_token_advantages(a, A, mask, 0.5),
        torch.tensor([[1.75, 1.25, 0.0], [-0.75, -0.375, -0.375]]),
    )


def test_alpha_follows_the_ema_between_low_and_high() -> None:
    gate = AgreementGate(low=0.2, high=0.6, decay=0.5)
    assert gate.alpha == 0.0  # nothing measured yet: GRPO
    assert gate.update(Agreement(0.4, 3, 1)) == pytest.approx(0.5)  # first measure starts it
    assert gate.update(Agreement(math.nan, 0, 4)) == pytest.approx(0.5)  # no group: unchanged
    assert gate.update(Agreement(0.8, 4, 0)) == pytest.approx(1.0)  # ema 0.6
    assert gate.update(Agreement(-1.0, 4, 0)) == pytest.approx(0.0)  # ema -0.2, clipped


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"low": 0.5, "high": 0.5}, r"gate.agreement: expected -1 <= low < high <= 1"),
        ({"low": -2.0, "high": 0.5}, r"gate.agreement"),
        ({"low": 0.1, "high": 0.5, "decay": 1.0}, r"gate.decay: expected a value in \[0, 1\)"),
    ],
)
def test_a_bad_gate_is_refused_naming_the_field(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(CreditError, match=message):
        AgreementGate(**kwargs)


def test_the_gate_measures_the_score_unless_told_attribution_and_dumps_only_a_change() -> None:
    """``measure: score`` (the default) reads no signal and is left out of the dump, so the
    configs (and run fingerprints) written before the key existed stay as they were;
    ``measure: attribution`` asks the backend for ``reward_attribution``."""
    score = GateConfig(agreement=(0.2, 0.6))
    assert score.measure == "score" and score.signals == frozenset()
    assert score.model_dump(mode="json") == {"agreement": [0.2, 0.6], "decay": 0.9}
    on = GateConfig(agreement=(0.05, 0.4), measure="attribution")
    assert on.signals == {"reward_attribution"}
    assert on.model_dump(mode="json")["measure"] == "attribution"
    with pytest.raises(ValueError, match="measure"):
        GateConfig(agreement=(0.2, 0.6), measure="gradient")  # type: ignore[arg-type]
