"""The contenders against the published baselines (``ablations.head_to_head``): paired
differences per setting over all families and per family, a verdict only from
``min_pairs`` pairs (Holm-corrected over the setting, ``contrasts.judge``), the best
baseline picked on the first half of the seeds and judged on the second (or the selection
effect stated), the entropy line, and its table and figure."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from ablations.contrasts import judge
from ablations.figures import is_png, plot_head_to_head
from ablations.head_to_head import (
    ALL_FAMILIES,
    STRONGEST_FILE,
    SettingHeadToHead,
    head_to_head,
    head_to_head_markdown,
    read_strongest,
    split_seeds,
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


def judged(
    rows: list[dict[str, Any]],
    spec: SummarySpec,
    contenders: list[str],
    published: list[str],
) -> list[SettingHeadToHead]:
    """The comparisons as the report gives them: decided by ``contrasts.judge``."""
    return judge([], head_to_head(rows, spec, contenders, published), spec)[1]


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
    (setting,) = judged(rows(), SPEC, ["datc"], ["entropy_top", "red"])
    assert setting.best == "entropy_top"
    by = {(c.baseline, c.family): c for c in setting.rows}
    pooled = by[("entropy_top", ALL_FAMILIES)]
    expected = sum(d - e for seeds in VALUES.values() for d, e, _ in seeds) / 6
    assert pooled.diff.n == 6 and abs(pooled.diff.mean - expected) < 1e-12
    assert pooled.sign == 1  # six pairs: a verdict
    assert by[("red", ALL_FAMILIES)].sign == 1
    assert setting.contrasts == 2  # the two pooled contrasts; per family and judging: 3 pairs
    assert by[("entropy_top", "llama")].diff.n == 3 and by[("entropy_top", "llama")].sign is None


def test_the_section_names_the_best_baseline_and_says_too_few_pairs_per_family(
    tmp_path: Path,
) -> None:
    compared = judged(rows(), SPEC, ["datc"], ["entropy_top", "red"])
    text = head_to_head_markdown(compared, SPEC.min_pairs)
    # picked on seed 0 of each family, judged on seeds 1 and 2: four pairs, too few
    assert (
        "- `datc` vs the best baseline `entropy_top` (picked on seeds gpt2 0, llama 0, judged "
        "on seeds gpt2 1/2, llama 1/2): too few pairs on the judging seeds for a verdict "
        "(n=4 < 6). Selection effect:" in text
    )
    assert "Verdicts Holm-corrected over 2 contrasts in this setting." in text
    assert "| `datc` | llama |" in text and "(too few pairs)" in text
    loose = dataclasses.replace(SPEC, min_pairs=3)
    text = head_to_head_markdown(judged(rows(), loose, ["datc"], ["entropy_top", "red"]), 3)
    assert "- `datc` beats the best baseline `entropy_top` (picked on seeds gpt2 0, llama 0" in text
    assert is_png(plot_head_to_head(tmp_path / "h2h.png", compared))


def test_a_setting_where_no_baseline_ran_has_no_comparison() -> None:
    only_datc = [r for r in rows() if r["strategy"] == "datc"]
    (setting,) = judged(only_datc, SPEC, ["datc"], ["entropy_top", "red"])
    assert setting.best is None and setting.rows == []


def test_a_report_whose_only_baseline_is_entropy_top_names_the_missing_stronger_one(
    tmp_path: Path,
) -> None:
    only_entropy = [r for r in rows() if r["strategy"] != "red"]
    compared = judged(only_entropy, SPEC, ["datc"], ["entropy_top", "red"])
    (setting,) = compared
    assert setting.best == "entropy_top" and setting.ran == ["entropy_top"]
    # the reference report (written beside every report) found red strongest here
    reference = tmp_path / STRONGEST_FILE
    reference.write_text(json.dumps({"toy": {"best": "red", "ran": ["entropy_top", "red"]}}))
    text = head_to_head_markdown(compared, SPEC.min_pairs, read_strongest(reference), "`full`")
    assert "Baselines that ran here: `entropy_top`." in text
    assert "**The strongest baseline of `full` for this setting, `red`, did not run here**" in text
    assert "- `datc` vs the best baseline `entropy_top`" in text
    # where the reference's strongest baseline ran, no such line
    full = judged(rows(), SPEC, ["datc"], ["entropy_top", "red"])
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


def test_seeds_split_by_seed_order_within_each_family() -> None:
    pairs = [("llama", s) for s in (3, 0, 2, 1)] + [("gpt2", s) for s in (5, 7, 6)]
    picking, judging = split_seeds(pairs)
    assert picking == [("gpt2", 5), ("llama", 0), ("llama", 1)]
    assert judging == [("gpt2", 6), ("gpt2", 7), ("llama", 2), ("llama", 3)]


def picked_rows(second_half_gap: float) -> list[dict[str, Any]]:
    """Two families x 8 seeds: ``abc`` is best on seeds 0-3 (0.60 against red's 0.50) and
    far behind on seeds 4-7 (0.10), so ``red`` has the higher mean over all seeds; datc is
    0.55 + noise on seeds 0-3 and red + ``second_half_gap`` + noise on seeds 4-7."""
    noise = [0.010, -0.020, 0.015, -0.005, 0.020, -0.010, 0.005, -0.015]
    out = []
    for family in ("llama", "gpt2"):
        for seed in range(8):
            first = seed < 4
            values = {
                "abc": 0.60 if first else 0.10,
                "red": 0.50,
                "datc": (0.55 if first else 0.50 + second_half_gap) + noise[seed],
            }
            for strategy, value in values.items():
                out.append(
                    {
                        "setting": "toy",
                        "family": family,
                        "strategy": strategy,
                        "seed": seed,
                        "step": 1,
                        "reward_mean": value,
                        "eval_reward_sampled": value,
                    }
                )
    return out


def test_the_best_baseline_is_picked_on_the_first_half_and_judged_on_the_second() -> None:
    (setting,) = judged(picked_rows(0.05), SPEC, ["datc"], ["abc", "red"])
    # abc wins the picking seeds (0-3) although red has the higher mean over all seeds
    assert setting.best == "abc"
    assert setting.picking == [(f, s) for f in ("gpt2", "llama") for s in range(4)]
    (b,) = setting.against_best
    # judged on seeds 4-7 only: datc - abc = 0.55 - 0.10 + noise, 8 pairs
    noise = [0.020, -0.010, 0.005, -0.015]
    assert b.judged.n == 8
    assert b.judged.mean == pytest.approx(0.45 + sum(noise) / 4, abs=1e-12)
    assert b.picking.n == 8 and b.pooled.n == 16
    assert b.sign == 1 and b.p_holm < 0.05
    # its family: 2 pooled + 4 per-family contrasts (8 pairs each) + the judged one
    assert setting.contrasts == 7
    text = head_to_head_markdown([setting], SPEC.min_pairs)
    assert "- `datc` beats the best baseline `abc` (picked on seeds gpt2 0/1/2/3, llama " in text
    assert "judged on seeds gpt2 4/5/6/7, llama 4/5/6/7): +0.450" in text
    assert "Holm-adjusted p < 0.001" in text
    assert "Verdicts Holm-corrected over 7 contrasts in this setting." in text


def test_too_few_judging_pairs_states_the_selection_effect() -> None:
    only_two_families = [r for r in picked_rows(0.05) if r["seed"] in (0, 1, 4, 5)]
    # seeds 0, 1, 4, 5 of each family: 0 and 1 pick (abc), 4 and 5 judge: 4 pairs < 6
    (setting,) = judged(only_two_families, SPEC, ["datc"], ["abc", "red"])
    (b,) = setting.against_best
    assert setting.best == "abc" and b.judged.n == 4 and b.sign is None
    text = head_to_head_markdown([setting], SPEC.min_pairs)
    assert "too few pairs on the judging seeds for a verdict (n=4 < 6)" in text
    assert "Selection effect: `abc` was picked as the best on the picking seeds" in text
    assert f"on the seeds not used to pick it {b.judged.mean:+.3f}" in text
    gap = b.judged.mean - b.picking.mean  # abc 0.60 on the picking seeds, 0.10 on the others
    assert gap == pytest.approx(0.5 + (0.020 - 0.010) / 2 - (0.010 - 0.020) / 2, abs=1e-12)
    assert f"the gap {gap:+.3f} estimates the selection effect (positive: the pick" in text
    assert "beats the best baseline" not in text


def entropy_rows(gap: float) -> list[dict[str, Any]]:
    """entropy_top = random_top + ``gap`` + alternating noise on 8 pairs; datc above both."""
    out = []
    for family in ("llama", "gpt2"):
        for seed in range(4):
            noise = 0.03 if (seed + (family == "gpt2")) % 2 else -0.03
            rand = 0.40 + 0.01 * seed
            for strategy, value in (
                ("datc", 0.70),
                ("entropy_top", rand + gap + noise),
                ("random_top", rand),
            ):
                out.append(
                    {
                        "setting": "toy",
                        "family": family,
                        "strategy": strategy,
                        "seed": seed,
                        "step": 1,
                        "reward_mean": value,
                        "eval_reward_sampled": value,
                    }
                )
    return out


def test_entropy_equal_to_random_within_its_interval_says_the_signal_made_no_difference() -> None:
    published = ["entropy_top", "random_top"]
    (tie,) = judged(entropy_rows(0.0), SPEC, ["datc"], published)
    assert tie.entropy_vs_random is not None and tie.entropy_vs_random.excludes_zero() == 0
    text = head_to_head_markdown([tie], SPEC.min_pairs)
    line = "- `entropy_top` minus its random control `random_top`: +0.000 ["
    assert line in text
    assert "**the entropy signal made no difference at this scale**" in text
    (apart,) = judged(entropy_rows(0.10), SPEC, ["datc"], published)
    assert apart.entropy_vs_random is not None and apart.entropy_vs_random.excludes_zero() == 1
    text = head_to_head_markdown([apart], SPEC.min_pairs)
    assert "made no difference" not in text
    assert "the entropy mask is above its random control (unadjusted interval)" in text
    # without random_top, no line
    (alone,) = judged(entropy_rows(0.0), SPEC, ["datc"], ["entropy_top"])
    assert alone.entropy_vs_random is None
    assert "random control" not in head_to_head_markdown([alone], SPEC.min_pairs)
