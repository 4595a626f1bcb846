"""CreditBatch and PolicyStats: bad input is a CreditError naming the field and the expectation."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch

from credit_core import (
    CreditBatch,
    CreditError,
    PolicyStats,
)

pytestmark = pytest.mark.usefixtures("single_torch_thread")

B, T, D = 2, 3, 4


def _stats(b: int = B, t: int = T, d: int = D) -> PolicyStats:
    return PolicyStats(
        p_sampled=torch.rand(b, t),
        p_sq=torch.rand(b, t),
        m1=torch.randn(b, t, d),
        m2=torch.randn(b, t, d),
        sampled_emb=torch.randn(b, t, d),
    )


def _fields(**override: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "advantages": torch.tensor([1.0, -1.0]),
        "mask": torch.tensor([[True, True, False], [True, False, False]]),
        "token_ids": torch.zeros(B, T, dtype=torch.long),
        "reward_grad": torch.randn(B, T, D),
        "policy_stats": _stats(),
    }
    fields.update(override)
    return fields


def test_valid_batch_constructs() -> None:
    batch = CreditBatch(**_fields())
    assert batch.batch_size == B and batch.lengths.tolist() == [2, 1]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"advantages": [1.0, -1.0]}, r"CreditBatch.advantages: expected a torch.Tensor, got list"),
        (
            {"advantages": torch.ones(B, 1)},
            r"CreditBatch.advantages: expected shape \(\*\), got \(2, 1\)",
        ),
        (
            {"advantages": torch.tensor([1, -1])},
            r"CreditBatch.advantages: expected a floating-point tensor, got torch.int64",
        ),
        (
            {"advantages": torch.tensor([1.0, float("nan")])},
            r"CreditBatch.advantages: expected finite values, rows \[1\]",
        ),
        (
            {"advantages": torch.tensor([float("-inf"), 0.0])},
            r"CreditBatch.advantages: expected finite values, rows \[0\]",
        ),
        (
            {"mask": torch.ones(3, T, dtype=torch.bool)},
            r"CreditBatch.mask: expected shape \(2, \*\), got \(3, 3\)",
        ),
        (
            {"mask": torch.ones(B, T, dtype=torch.long)},
            r"CreditBatch.mask: expected dtype torch.bool, got torch.int64",
        ),
        (
            {"mask": torch.ones(B, T, dtype=torch.bool, device="meta")},
            r"CreditBatch.mask: expected device cpu, got meta",
        ),
        (
            {"mask": torch.tensor([[True, False, False], [False, False, False]])},
            r"CreditBatch.mask: .*at least one valid token.*rows \[1\] are empty",
        ),
        (
            {
                "mask": torch.zeros(B, 0, dtype=torch.bool),
                "token_ids": torch.zeros(B, 0, dtype=torch.long),
                "reward_grad": None,
                "policy_stats": None,
            },
            r"CreditBatch.mask: .*rows \[0, 1\] are empty",
        ),
        (
            {"token_ids": torch.zeros(B, T + 1, dtype=torch.long)},
            r"CreditBatch.token_ids: expected shape \(2, 3\), got \(2, 4\)",
        ),
        (
            {"token_ids": torch.zeros(B, T, dtype=torch.int32)},
            r"CreditBatch.token_ids: expected dtype torch.int64, got torch.int32",
        ),
        (
            {"token_ids": torch.zeros(B, T, dtype=torch.long, device="meta")},
            r"CreditBatch.token_ids: expected device cpu, got meta",
        ),
        (
            {"reward_grad": torch.randn(B, T)},
            r"CreditBatch.reward_grad: expected shape \(2, 3, \*\), got \(2, 3\)",
        ),
        (
            {"reward_grad": torch.randn(B, T + 1, D)},
            r"CreditBatch.reward_grad: expected shape \(2, 3, \*\), got \(2, 4, 4\)",
        ),
        (
            {"reward_grad": torch.zeros(B, T, D, dtype=torch.long)},
            r"CreditBatch.reward_grad: expected a floating-point tensor",
        ),
        (
            {"reward_grad": torch.randn(B, T, D, device="meta")},
            r"CreditBatch.reward_grad: expected device cpu, got meta",
        ),
        (
            {"policy_stats": {"m1": torch.zeros(1)}},
            r"CreditBatch.policy_stats: expected PolicyStats, got dict",
        ),
        (
            {"policy_stats": _stats(b=3)},
            r"CreditBatch.policy_stats.p_sampled: expected shape \(2, 3\), got \(3, 3\)",
        ),
        (
            {"policy_stats": _stats(t=1)},
            r"CreditBatch.policy_stats.p_sampled: expected shape \(2, 3\), got \(2, 1\)",
        ),
        (
            {"policy_stats": _stats(d=D + 1)},
            r"CreditBatch.policy_stats.m1: expected embedding width d=4 \(from reward_grad\), "
            r"got 5",
        ),
    ],
)
def test_credit_batch_rejects(override: dict[str, Any], message: str) -> None:
    with pytest.raises(CreditError, match=message):
        CreditBatch(**_fields(**override))


def test_credit_batch_rejects_an_empty_batch() -> None:
    with pytest.raises(CreditError, match=r"CreditBatch.advantages: .*at least one response"):
        CreditBatch(torch.zeros(0), torch.zeros(0, 3, dtype=torch.bool), torch.zeros(0, 3).long())


def test_credit_batch_rejects_advantages_on_another_device() -> None:
    with pytest.raises(CreditError, match=r"CreditBatch.mask: expected device meta, got cpu"):
        CreditBatch(**_fields(advantages=torch.zeros(B, device="meta")))


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        (
            "p_sampled",
            torch.rand(B),
            r"PolicyStats.p_sampled: expected shape \(\*, \*\), got \(2,\)",
        ),
        (
            "p_sampled",
            torch.ones(B, T, dtype=torch.long),
            r"PolicyStats.p_sampled: expected a floating-point",
        ),
        ("p_sq", torch.rand(B, T + 1), r"PolicyStats.p_sq: expected shape \(2, 3\), got \(2, 4\)"),
        ("m1", torch.randn(B, T), r"PolicyStats.m1: expected shape \(2, 3, \*\), got \(2, 3\)"),
        (
            "m2",
            torch.randn(B, T, D + 1),
            r"PolicyStats.m2: expected shape \(2, 3, 4\), got \(2, 3, 5\)",
        ),
        (
            "sampled_emb",
            torch.randn(B, T, D, device="meta"),
            r"PolicyStats.sampled_emb: expected device cpu, got meta",
        ),
    ],
)
def test_policy_stats_container_rejects(field: str, value: torch.Tensor, message: str) -> None:
    fields = {f: getattr(_stats(), f) for f in ("p_sampled", "p_sq", "m1", "m2", "sampled_emb")}
    fields[field] = value
    with pytest.raises(CreditError, match=message):
        PolicyStats(**fields)


def test_policy_stats_cat_of_nothing() -> None:
    with pytest.raises(CreditError, match=r"PolicyStats.cat: expected at least one"):
        PolicyStats.cat([])


def test_replace_keeps_validation() -> None:
    """dataclasses.replace re-runs CreditBatch's checks (what the strategy tests rely on)."""
    batch = CreditBatch(**_fields())
    with pytest.raises(CreditError, match=r"CreditBatch.reward_grad"):
        replace(batch, reward_grad=torch.randn(B, T))
