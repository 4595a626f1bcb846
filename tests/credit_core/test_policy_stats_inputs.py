"""policy_stats and policy_stats_from_logits: bad input is a CreditError naming the tensor."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from credit_core import (
    CreditError,
    policy_stats,
    policy_stats_from_logits,
)

pytestmark = pytest.mark.usefixtures("single_torch_thread")

B, T, D, H, V = 2, 3, 4, 6, 10


def _ps_args(**override: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "hidden": torch.randn(B, T, H),
        "lm_head_weight": torch.randn(V, H),
        "token_ids": torch.randint(0, V, (B, T)),
        "reward_embedding": torch.randn(V, D),
    }
    args.update(override)
    return args


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"hidden": torch.randn(B * T, H)}, r"hidden: expected shape \(\*, \*, \*\), got \(6, 6\)"),
        (
            {"hidden": torch.zeros(B, T, H, dtype=torch.long)},
            r"hidden: expected a floating-point tensor",
        ),
        (
            {"lm_head_weight": torch.randn(V, H + 1)},
            r"lm_head_weight: expected shape \(\*, 6\), got \(10, 7\)",
        ),
        (
            {"lm_head_weight": torch.randn(V, H, device="meta")},
            r"lm_head_weight: expected device cpu, got meta",
        ),
        ({"lm_head_bias": torch.randn(V + 1)}, r"lm_head_bias: expected shape \(10\), got \(11,\)"),
        (
            {"token_ids": torch.zeros(B, T + 1, dtype=torch.long)},
            r"token_ids: expected shape \(2, 3\), got \(2, 4\)",
        ),
        (
            {"token_ids": torch.zeros(B, T)},
            r"token_ids: expected an integer dtype, got torch.float32",
        ),
        (
            {"token_ids": torch.zeros(B, T, dtype=torch.bool)},
            r"token_ids: expected an integer dtype, got torch.bool",
        ),
        (
            {"token_ids": torch.full((B, T), V)},
            r"token_ids: expected values in \[0, 10\) \(the vocabulary\), got \[10, 10\]",
        ),
        (
            {"token_ids": torch.tensor([[0, -1, 2], [3, 4, 5]])},
            r"token_ids: expected values in \[0, 10\).*got \[-1, 5\]",
        ),
        (
            {"reward_embedding": torch.randn(V + 2, D)},
            r"reward_embedding: expected shape \(10, \*\), got \(12, 4\)",
        ),
        (
            {"reward_embedding": torch.zeros(V, D, dtype=torch.long)},
            r"reward_embedding: expected a floating-point",
        ),
        ({"temperature": 0.0}, r"temperature: expected a finite value > 0, got 0.0"),
        ({"temperature": -1.0}, r"temperature: expected a finite value > 0, got -1.0"),
        ({"temperature": float("nan")}, r"temperature: expected a finite value > 0, got nan"),
        ({"temperature": float("inf")}, r"temperature: expected a finite value > 0, got inf"),
        ({"chunk_size": 0}, r"chunk_size: expected an integer >= 1, got 0"),
        ({"chunk_size": 2.5}, r"chunk_size: expected an integer >= 1, got 2.5"),
        ({"tile_elements": 0}, r"tile_elements: expected an integer >= 1, got 0"),
    ],
)
def test_policy_stats_rejects(override: dict[str, Any], message: str) -> None:
    with pytest.raises(CreditError, match=message):
        policy_stats(**_ps_args(**override))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"logits": torch.randn(B, T)}, r"logits: expected shape \(\*, \*, \*\), got \(2, 3\)"),
        ({"logits": torch.zeros(B, T, V, dtype=torch.long)}, r"logits: expected a floating-point"),
        (
            {"token_ids": torch.zeros(B + 1, T, dtype=torch.long)},
            r"token_ids: expected shape \(2, 3\), got \(3, 3\)",
        ),
        ({"token_ids": torch.full((B, T), V + 3)}, r"token_ids: expected values in \[0, 10\)"),
        (
            {"reward_embedding": torch.randn(V - 1, D)},
            r"reward_embedding: expected shape \(10, \*\), got \(9, 4\)",
        ),
        ({"temperature": 0.0}, r"temperature: expected a finite value > 0"),
        ({"chunk_size": -3}, r"chunk_size: expected an integer >= 1, got -3"),
        ({"tile_elements": -1}, r"tile_elements: expected an integer >= 1, got -1"),
    ],
)
def test_policy_stats_from_logits_rejects(override: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {
        "logits": torch.randn(B, T, V),
        "token_ids": torch.randint(0, V, (B, T)),
        "reward_embedding": torch.randn(V, D),
    }
    args.update(override)
    with pytest.raises(CreditError, match=message):
        policy_stats_from_logits(**args)
