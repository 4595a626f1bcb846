"""Early direction-model agreement against the gain over GRPO (``ablations.agreement_gain``):
each pair's first logged agreements, the same-training GRPO run as its baseline, rho, the
split at the gate's pre-registered low."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from ablations.ablation_config import load_ablate_config
from ablations.agreement_gain import (
    ATTRIBUTION,
    EARLY_STEPS,
    SCORE,
    agreement_gains,
    agreement_markdown,
    early_agreement,
    same_training_grpo,
)
from ablations.figures import is_png, plot_agreement
from ablations.runner import summary_spec
from tests.helpers.paths import REPO

FIDELITY = REPO / "configs" / "ablate" / "fidelity.yaml"
GATE = REPO / "configs" / "ablate" / "gate.yaml"


def test_each_strategy_is_paired_with_grpo_trained_the_same_way() -> None:
    pairs = same_training_grpo(load_ablate_config(FIDELITY))
    assert pairs["datc_lr1e-3"] == pairs["red_matched_lr1e-3"] == "uniform_lr1e-3"
    assert pairs["datc"] == pairs["p2t_matched"] == "uniform"  # the 3e-4 secondaries
    assert not any(label.startswith("uniform") for label in pairs)


def test_the_early_agreement_is_the_mean_of_the_first_logged_finite_values() -> None:
    rows = [{"step": s, "credit_direction_agreement": 0.5} for s in range(2, EARLY_STEPS + 2)]
    rows += [{"step": 1, "credit_direction_agreement": math.nan}, {"step": 0}]
    rows += [{"step": 50, "credit_direction_agreement": -1.0}]  # after the first ten
    assert early_agreement(rows) == pytest.approx(0.5)
    assert early_agreement([{"step": 0}, {"step": 1, "credit_direction_agreement": ""}]) is None


def _run(strategy: str, seed: int, held_out: float, agreement: float | None) -> list[Any]:
    rows = []
    for step in range(12):
        row: dict[str, Any] = {
            "setting": "binary",
            "family": "llama",
            "strategy": strategy,
            "seed": seed,
            "step": step,
            "reward_mean": 0.0,
        }
        if agreement is not None:
            row["credit_direction_agreement"] = agreement if step < 10 else 0.99
        if step == 11:
            row["eval_reward_sampled"] = held_out
        rows.append(row)
    return rows


def test_gain_against_early_agreement_per_setting_and_strategy(tmp_path: Path) -> None:
    cfg = load_ablate_config(GATE)  # every strategy at the same learning rate: uniform
    agreements, gains = [0.1, 0.5, 0.6, 0.7], [-0.02, 0.1, 0.2, 0.3]
    rows = []
    for seed, (a, g) in enumerate(zip(agreements, gains, strict=True)):
        rows += _run("uniform", seed, 0.3, None) + _run("datc", seed, 0.3 + g, a)
    (table,) = agreement_gains(rows, summary_spec(cfg), cfg)
    assert (table.setting, table.strategy, table.baseline) == ("binary", "datc", "uniform")
    assert [p.agreement for p in table.points] == pytest.approx(agreements)
    assert [p.gain for p in table.points] == pytest.approx(gains)
    assert table.rho == pytest.approx(1.0)
    assert SCORE.split == 0.2
    assert table.split(below=True) == (pytest.approx(-0.02), 1)
    assert table.split(below=False) == (pytest.approx(0.2), 3)
    text = agreement_markdown([table], "figures/agreement_gain.png")
    assert "| binary | `datc` | `uniform` | 4 | 0.100 to 0.700 | 1.000 |" in text
    assert text.endswith("![direction model's agreement and gain](figures/agreement_gain.png)")
    assert is_png(plot_agreement(tmp_path / "figures" / "agreement_gain.png", [table]))


def test_the_attribution_agreement_gets_its_own_section_split_at_its_gate_s_low() -> None:
    """Runs that logged ``credit/attribution_agreement`` (a gate on it, or P2T) are read on
    that column, split at the attribution gate's pre-registered 0.05; runs without it give
    no section."""
    cfg = load_ablate_config(GATE)
    agreements, gains = [-0.3, 0.0, 0.3, 0.6], [-0.2, -0.1, 0.1, 0.2]
    rows = []
    for seed, (a, g) in enumerate(zip(agreements, gains, strict=True)):
        run = _run("datc", seed, 0.3 + g, 0.9)  # the score agreement is high throughout
        for row in run:
            row["credit_attribution_agreement"] = a
        rows += _run("uniform", seed, 0.3, None) + run
    (table,) = agreement_gains(rows, summary_spec(cfg), cfg, ATTRIBUTION)
    assert table.measure is ATTRIBUTION and ATTRIBUTION.split == 0.05
    assert [p.agreement for p in table.points] == pytest.approx(agreements)
    assert table.split(below=True) == (pytest.approx(-0.15), 2)
    (score,) = agreement_gains(rows, summary_spec(cfg), cfg, SCORE)
    assert math.isnan(score.rho)  # constant score agreement: no ranking
    text = agreement_markdown([table], None)
    assert text.startswith("## Does the attribution agreement predict the gain?")
    assert "`credit/attribution_agreement`" in text and "agreement < 0.05" in text
    plain = [r for r in rows if r["strategy"] == "uniform"]
    assert agreement_gains(plain, summary_spec(cfg), cfg, ATTRIBUTION) == []
