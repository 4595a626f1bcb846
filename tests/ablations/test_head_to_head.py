"""The contenders against the published baselines (``ablations.head_to_head``): paired
differences per setting over all families and per family, a verdict only from
``min_pairs`` pairs, the best baseline by mean held-out metric, and its table and figure."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ablations.figures import is_png, plot_head_to_head
from ablations.head_to_head import ALL_FAMILIES, head_to_head, head_to_head_markdown
from ablations.summary import SettingSpec, SummarySpec

SPEC = SummarySpec(
    settings=[SettingSpec("toy", "1. toy", "eval_reward_sampled", "reward", 0.2)],
    strategies=["uniform", "datc", "entropy_top", "red"],
    baseline="uniform",
    method="datc",
    control=None,
)

#: Per seed: datc, entropy_top, red on two families; datc is ~0.1 above entropy_top and
#: ~0.3 above red; entropy_top is the best baseline.
VALUES = {
    "llama": [(0.60, 0.50, 0.30), (0.65, 0.56, 0.33), (0.58, 0.47, 0.29)],
    "gpt2": [(0.70, 0.61, 0.41), (0.62, 0.50, 0.30), (0.66, 0.57, 0.35)],
}


def rows() -> list[dict[str, Any]]:
    return [
        {
            "setting": "toy",
            "family": family,
            "strategy": strategy,
            "seed": seed,
            "step": 1,
            "reward_mean": value,
            "eval_reward_sampled": value,
        }
        for family, seeds in VALUES.items()
        for seed, values in enumerate(seeds)
        for strategy, value in zip(("datc", "entropy_top", "red"), values, strict=True)
    ]


def test_paired_differences_over_all_families_and_each_with_the_best_baseline() -> None:
    (setting,) = head_to_head(rows(), SPEC, ["datc"], ["entropy_top", "red"])
    assert setting.best == "entropy_top"
    by = {(c.baseline, c.family): c for c in setting.rows}
    pooled = by[("entropy_top", ALL_FAMILIES)]
    expected = sum(d - e for seeds in VALUES.values() for d, e, _ in seeds) / 6
    assert pooled.diff.n == 6 and abs(pooled.diff.mean - expected) < 1e-12
    assert pooled.sign == 1  # six pairs: a verdict
    assert by[("red", ALL_FAMILIES)].sign == 1
    assert by[("entropy_top", "llama")].diff.n == 3 and by[("entropy_top", "llama")].sign is None


def test_the_section_names_the_best_baseline_and_says_too_few_pairs_per_family(
    tmp_path: Path,
) -> None:
    compared = head_to_head(rows(), SPEC, ["datc"], ["entropy_top", "red"])
    text = head_to_head_markdown(compared, SPEC.min_pairs)
    assert "- `datc` beats the best baseline `entropy_top`: +0.1" in text
    assert "| `datc` | llama |" in text and "(too few pairs)" in text
    strict = dataclasses.replace(SPEC, min_pairs=7)
    text = head_to_head_markdown(head_to_head(rows(), strict, ["datc"], ["entropy_top", "red"]), 7)
    assert "- `datc` vs the best baseline `entropy_top`" in text
    assert is_png(plot_head_to_head(tmp_path / "h2h.png", compared))


def test_a_setting_where_no_baseline_ran_has_no_comparison() -> None:
    only_datc = [r for r in rows() if r["strategy"] == "datc"]
    (setting,) = head_to_head(only_datc, SPEC, ["datc"], ["entropy_top", "red"])
    assert setting.best is None and setting.rows == []
