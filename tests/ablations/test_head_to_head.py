"""The contenders against the published baselines (``ablations.head_to_head``): paired
differences per setting over all families and per family, a verdict only from
``min_pairs`` pairs, the best baseline by mean held-out metric, and its table and figure."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from ablations.figures import is_png, plot_head_to_head
from ablations.head_to_head import (
    ALL_FAMILIES,
    STRONGEST_FILE,
    head_to_head,
    head_to_head_markdown,
    read_strongest,
    strongest_baselines,
)
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


def test_a_report_whose_only_baseline_is_entropy_top_names_the_missing_stronger_one(
    tmp_path: Path,
) -> None:
    only_entropy = [r for r in rows() if r["strategy"] != "red"]
    compared = head_to_head(only_entropy, SPEC, ["datc"], ["entropy_top", "red"])
    (setting,) = compared
    assert setting.best == "entropy_top" and setting.ran == ["entropy_top"]
    # the reference report (written beside every report) found red strongest here
    reference = tmp_path / STRONGEST_FILE
    reference.write_text(json.dumps({"toy": {"best": "red", "ran": ["entropy_top", "red"]}}))
    text = head_to_head_markdown(compared, SPEC.min_pairs, read_strongest(reference), "`full`")
    assert "Baselines that ran here: `entropy_top`." in text
    assert "**The strongest baseline of `full` for this setting, `red`, did not run here**" in text
    assert "- `datc` beats the best baseline `entropy_top`" in text
    # where the reference's strongest baseline ran, no such line
    full = head_to_head(rows(), SPEC, ["datc"], ["entropy_top", "red"])
    text = head_to_head_markdown(full, SPEC.min_pairs, {"toy": "red"}, "`full`")
    assert "did not run here" not in text
    assert "Baselines that ran here: `entropy_top`, `red`." in text


def test_the_strongest_baselines_round_trip_and_a_malformed_file_is_refused(
    tmp_path: Path,
) -> None:
    compared = head_to_head(rows(), SPEC, ["datc"], ["entropy_top", "red"])
    path = tmp_path / STRONGEST_FILE
    path.write_text(json.dumps(strongest_baselines(compared)))
    assert read_strongest(path) == {"toy": "entropy_top"}
    path.write_text(json.dumps({"toy": ["red"]}))
    with pytest.raises(ValueError, match="toy: expected"):
        read_strongest(path)


def test_the_committed_full_report_finds_red_strongest_on_the_quick_settings() -> None:
    strongest = read_strongest(Path(__file__).parents[2] / "docs/results/full" / STRONGEST_FILE)
    assert strongest["positional_sparse"] == "red" and strongest["target_tokens"] == "red"
