"""Sample efficiency and the probe summary (``ablations.summary``), by hand.

- ``efficiency``: trapezoid mean of a held-out curve and its values at 25% / 50% of the
  budget (interpolated); NaN with fewer than two points (older results).
- ``summarize`` takes the probes at the first and last evaluation that has them, averages
  them over seeds (compared credits included), and leaves them NaN for runs without them.
"""

from __future__ import annotations

import math

import pytest

from ablations.report import compared_markdown, efficiency_markdown
from ablations.summary import SettingSpec, SummarySpec, efficiency, summarize


def test_efficiency_by_hand() -> None:
    e = efficiency([(0, 0.1), (10, 0.5), (20, 0.3)], 20)
    assert e.auc == pytest.approx((10 * 0.3 + 10 * 0.4) / 20)
    assert e.at_25 == pytest.approx(0.3)  # step 5: halfway from 0.1 to 0.5
    assert e.at_50 == pytest.approx(0.5)
    old = efficiency([(20, 0.3)], 20)
    assert math.isnan(old.auc) and math.isnan(old.at_25) and math.isnan(old.at_50)


def _rows() -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for seed, (c0, c1) in enumerate([(0.8, -0.4), (0.6, -0.2)]):
        for step, corr, held in ((0, c0, 0.1), (5, None, None), (10, c1, 0.5)):
            for strat in ("uniform", "datc"):
                row: dict[str, object] = {
                    "setting": "toy",
                    "family": "llama",
                    "strategy": strat,
                    "seed": seed,
                    "step": step,
                    "reward_mean": 0.2,
                }
                if held is not None:
                    row["eval_reward_sampled"] = held
                    row["probe_grad_cos"] = 0.5
                    row["probe_metric"] = held
                    row["probe_credit_corr@datc"] = corr
                    if strat == "datc":
                        row["probe_credit_corr"] = corr
                rows.append(row)
    rows.append(  # an older run: no probes
        {
            "setting": "toy",
            "family": "llama",
            "strategy": "datc",
            "seed": 2,
            "step": 10,
            "reward_mean": 0.2,
            "eval_reward_sampled": 0.4,
        }
    )
    return rows


def test_probe_summary_over_seeds() -> None:
    spec = SummarySpec(
        settings=[SettingSpec("toy", "toy", "eval_reward_sampled", "reward", 0.1)],
        strategies=["uniform", "datc"],
        baseline="uniform",
        method="datc",
        control=None,
    )
    (table,), _ = summarize(_rows(), spec)
    datc, uni = table.strategies["datc"], table.strategies["uniform"]
    assert datc.probes_start["probe_credit_corr"].mean == pytest.approx(0.7)
    assert datc.probes_end["probe_credit_corr"].mean == pytest.approx(-0.3)
    assert datc.probes_end["probe_credit_corr"].n == 2  # the old run has none
    assert uni.probes_end["probe_credit_corr"].n == 0  # uniform credit: undefined
    assert uni.probes_end["probe_credit_corr@datc"].mean == pytest.approx(-0.3)
    assert datc.auc.mean == pytest.approx(0.3) and datc.auc.n == 2
    md = efficiency_markdown(table, "reward")
    assert "+0.70 → -0.30" in md and "| `uniform` |" in md
    compared = compared_markdown(table)
    assert compared is not None and "credit corr of `datc`" in compared
