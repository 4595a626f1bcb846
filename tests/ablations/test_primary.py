"""The pre-registered primary family (``ablations.primary``; docs/design.md, "Evaluation"):
its contrasts' exact sign-flip p by brute-force enumeration, Holm over the family and the
t-test beside it against statsmodels' ``multipletests``, the paired AUC difference by the
trapezoid rule by hand, GRPO's row picked among its learning rates, the flattening line,
and the report a config with a family writes (everything else secondary), through the
runner's own ``write_outputs``."""

from __future__ import annotations

import dataclasses
import itertools
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats as scipy_stats
from statsmodels.stats.multitest import multipletests

from ablations.ablation_config import AblateConfig, load_ablate_config
from ablations.contrasts import judge
from ablations.head_to_head import head_to_head, head_to_head_markdown
from ablations.primary import PrimaryResult, primary_family, primary_markdown
from ablations.results import read_csv, write_csv
from ablations.runner import REPORT_FILE, plan_runs, summary_spec, write_outputs
from ablations.summary import PrimaryFamily, SettingSpec, SummarySpec, fmt_interval, summarize
from tests.helpers.paths import REPO

SETTINGS = ("toy", "other")
FAMILIES = ("llama", "gpt2")
SEEDS = range(6)
STEPS = (0, 10, 20)
FAMILY = PrimaryFamily(
    against_baseline=("datc", "p2t_m", "sparse"),
    pairs=(("datc", "p2t_m"),),
    baseline_best_of=("uniform", "uniform_hi"),
)
SPEC = SummarySpec(
    settings=[
        SettingSpec(n, f"{i + 1}. {n}", "eval_reward_sampled", "reward")
        for i, n in enumerate(SETTINGS)
    ],
    strategies=["uniform", "uniform_hi", "datc", "p2t_m", "sparse", "red"],
    baseline="uniform",
    method="datc",
    control=None,
    primary_family=FAMILY,
)


def curves() -> dict[tuple[str, str, str, int], list[float]]:
    """(setting, family, strategy, seed) -> held-out reward at ``STEPS``. ``uniform_hi`` is
    the better GRPO (its learning rate); ``datc`` is above it on every pair, ``p2t_m`` level
    with it; ``sparse`` ran on 4 pairs of ``toy`` only. GRPO still rises in ``toy`` and has
    flattened in ``other``."""
    gen = np.random.default_rng(11)
    out = {}
    for setting, family, seed in itertools.product(SETTINGS, FAMILIES, SEEDS):
        rise = 0.05 if setting == "toy" else 0.0
        mid = 0.40 + gen.normal(0, 0.02)
        hi = [0.2, mid, mid + rise + gen.normal(0, 0.01)]
        out[(setting, family, "uniform_hi", seed)] = hi
        out[(setting, family, "uniform", seed)] = [v - 0.05 for v in hi]
        out[(setting, family, "datc", seed)] = [v + 0.03 + abs(gen.normal(0, 0.02)) for v in hi]
        out[(setting, family, "p2t_m", seed)] = [v + gen.normal(0, 0.03) for v in hi]
        out[(setting, family, "red", seed)] = [v - 0.1 for v in hi]
        if setting == "toy" and seed < 2:
            out[(setting, family, "sparse", seed)] = [v + 0.2 + gen.normal(0, 0.01) for v in hi]
    return out


def rows(values: dict[tuple[str, str, str, int], list[float]]) -> list[dict[str, Any]]:
    return [
        {
            "setting": setting,
            "family": family,
            "strategy": strategy,
            "seed": seed,
            "step": step,
            "reward_mean": value,
            "eval_reward_sampled": value,
            "wall_s": 1.0,
        }
        for (setting, family, strategy, seed), curve in values.items()
        for step, value in zip(STEPS, curve, strict=True)
    ]


@pytest.fixture(scope="module")
def result() -> PrimaryResult:
    return primary_family(rows(curves()), SPEC)


def _brute_sign_flip(d: list[float]) -> float:
    observed = abs(sum(d))
    signs = itertools.product((1.0, -1.0), repeat=len(d))
    hits = sum(
        abs(sum(s * x for s, x in zip(f, d, strict=True))) >= observed - 1e-12 for f in signs
    )
    return hits / 2 ** len(d)


def _diffs(
    values: dict[tuple[str, str, str, int], list[float]], setting: str, a: str, b: str
) -> list[float]:
    return [
        values[(setting, f, a, s)][-1] - values[(setting, f, b, s)][-1]
        for f, s in sorted(itertools.product(FAMILIES, SEEDS))
        if (setting, f, a, s) in values and (setting, f, b, s) in values
    ]


def test_grpos_row_is_the_best_learning_rate_by_its_mean_over_all_pairs(
    result: PrimaryResult,
) -> None:
    values = curves()
    for pick in result.picks:
        for label in ("uniform", "uniform_hi"):
            by_hand = [values[(pick.setting, f, label, s)][-1] for f in FAMILIES for s in SEEDS]
            assert pick.means[label] == pytest.approx(sum(by_hand) / len(by_hand))
        assert pick.label == "uniform_hi"
    grpo = [c for c in result.contrasts if c.against_grpo]
    assert {c.against for c in grpo} == {"uniform_hi"}
    assert result.grpo_rows() == {"toy": "uniform_hi", "other": "uniform_hi"}  # the sweeps'
    fixed = dataclasses.replace(FAMILY, baseline_best_of=())
    plain = primary_family(rows(curves()), dataclasses.replace(SPEC, primary_family=fixed))
    assert [p.label for p in plain.picks] == ["uniform", "uniform"] and plain.grpo_rows() is None


def test_each_contrast_is_the_paired_difference_with_its_exact_sign_flip_p(
    result: PrimaryResult,
) -> None:
    values = curves()
    declared = [(c.setting, c.contender, c.against) for c in result.contrasts]
    assert declared == [
        ("toy", "datc", "uniform_hi"),
        ("toy", "p2t_m", "uniform_hi"),
        ("toy", "sparse", "uniform_hi"),
        ("toy", "datc", "p2t_m"),
        ("other", "datc", "uniform_hi"),
        ("other", "p2t_m", "uniform_hi"),  # sparse did not run in `other`: no contrast
        ("other", "datc", "p2t_m"),
    ]
    for c in result.contrasts:
        d = _diffs(values, c.setting, c.contender, c.against)
        assert c.diff.n == len(d) and c.diff.mean == pytest.approx(np.mean(d))
        assert c.p_sign_flip == pytest.approx(_brute_sign_flip(d), abs=1e-15)
        assert c.diff.p == pytest.approx(scipy_stats.ttest_1samp(d, 0.0).pvalue)
        assert (c.below, c.above) == (sum(x < 0 for x in d), sum(x > 0 for x in d))
    datc = result.contrasts[0]
    assert datc.p_sign_flip == 2 / 2**12  # above GRPO on all 12 pairs: the floor
    assert (datc.below, datc.above) == (0, 12)


def test_a_tied_pair_is_neither_below_nor_above() -> None:
    """p2t_m equal to GRPO on two pairs of `other`: 10 pairs counted, n stays 12."""
    values = curves()
    for seed in (0, 1):
        values[("other", "llama", "p2t_m", seed)] = values[("other", "llama", "uniform_hi", seed)]
    tied = primary_family(rows(values), SPEC)
    (c,) = (c for c in tied.contrasts if (c.setting, c.contender) == ("other", "p2t_m"))
    assert c.diff.n == 12 and c.below + c.above == 10
    assert f"| 12 | {fmt_interval(c.diff, signed=True)} | {c.below} / {c.above} | " in (
        primary_markdown(tied, SPEC)
    )


def test_holm_runs_over_the_family_with_enough_pairs_and_the_t_test_sits_beside_it(
    result: PrimaryResult,
) -> None:
    members = [c for c in result.contrasts if c.diff.n >= SPEC.min_pairs]
    assert result.size == len(members) == 6  # `sparse` (4 pairs) gets no verdict
    sparse = next(c for c in result.contrasts if c.contender == "sparse")
    assert sparse.sign is None and math.isnan(sparse.p_holm) and math.isnan(sparse.p_t_holm)
    _, by_flip, _, _ = multipletests([c.p_sign_flip for c in members], method="holm")
    _, by_t, _, _ = multipletests([c.diff.p for c in members], method="holm")
    assert [c.p_holm for c in members] == pytest.approx(list(by_flip), abs=1e-12)
    assert [c.p_t_holm for c in members] == pytest.approx(list(by_t), abs=1e-12)
    for c in members:
        assert c.sign == ((1 if c.diff.mean > 0 else -1) if c.p_holm < 0.05 else 0)
    signs = {(c.setting, c.contender, c.against): c.sign for c in members}
    assert signs[("toy", "datc", "uniform_hi")] == 1 == signs[("other", "datc", "uniform_hi")]
    assert signs[("toy", "p2t_m", "uniform_hi")] == 0


def test_the_auc_difference_is_the_trapezoid_area_over_the_step_span(
    result: PrimaryResult,
) -> None:
    values = curves()

    def auc(curve: list[float]) -> float:
        area = sum((STEPS[i + 1] - STEPS[i]) * (curve[i] + curve[i + 1]) / 2 for i in range(2))
        return area / (STEPS[-1] - STEPS[0])

    assert auc([0.2, 0.4, 0.5]) == pytest.approx((10 * 0.3 + 10 * 0.45) / 20)
    for c in result.contrasts:
        by_hand = [
            auc(values[(c.setting, f, c.contender, s)]) - auc(values[(c.setting, f, c.against, s)])
            for f, s in sorted(itertools.product(FAMILIES, SEEDS))
            if (c.setting, f, c.contender, s) in values
        ]
        assert (c.auc.n, c.auc.mean) == (len(by_hand), pytest.approx(np.mean(by_hand)))


def test_the_flattening_line_is_grpos_change_over_its_last_two_evaluations(
    result: PrimaryResult,
) -> None:
    values = curves()
    toy, other = result.flattening
    for line in (toy, other):
        by_hand = [
            values[(line.setting, f, "uniform_hi", s)][-1]
            - values[(line.setting, f, "uniform_hi", s)][-2]
            for f in FAMILIES
            for s in SEEDS
        ]
        assert line.change.mean == pytest.approx(np.mean(by_hand)) and line.steps == (10, 20)
    assert toy.change.excludes_zero() == 1 and other.change.excludes_zero() == 0
    text = primary_markdown(result, SPEC)
    assert "- 1. toy: `uniform_hi`" in text and "**still rising**" in text
    assert (
        "- 2. other: `uniform_hi`" in text and "no rise detected (the interval contains 0)" in text
    )


def test_the_section_names_the_family_the_test_and_each_verdict(result: PrimaryResult) -> None:
    text = primary_markdown(result, SPEC)
    assert text.startswith("## Primary family (pre-registered)")
    assert "`datc` vs GRPO, `p2t_m` vs GRPO, `sparse` vs GRPO, `datc` vs `p2t_m`" in text
    assert "exact paired sign-flip test" in text and "Holm-corrected over the 6 contrasts" in text
    assert "the best of `uniform`, `uniform_hi`" in text and "**`uniform_hi`**" in text
    datc = result.contrasts[0]
    row = (
        f"| 1. toy | `datc` − GRPO (`uniform_hi`) | 12 | {datc.diff.mean:+.3f} "
        f"[{datc.diff.low:+.3f}, {datc.diff.high:+.3f}] | 0 / 12 | 0.000488 | {datc.p_holm:.3g} | "
        f"**better** | {datc.p_t_holm:.3g} | {datc.auc.mean:+.3f} ["
    )
    assert row in text
    assert "| 1. toy | `sparse` − GRPO (`uniform_hi`) | 4 |" in text and "too few pairs" in text
    assert "- `datc` vs GRPO: better in 2, worse in 0, not different in 0 of 2 settings." in text
    assert "- `sparse` vs GRPO: better in 0, worse in 0, not different in 0 of 1 setting" in text


def test_with_a_family_every_other_contrast_is_secondary_without_a_verdict() -> None:
    data = rows(curves())
    _, verdicts = summarize(data, SPEC)
    compared = head_to_head(data, SPEC, ["datc"], ["red"])
    verdicts, compared = judge(verdicts, compared, SPEC)
    assert all(v.sign is None and v.contrasts == 0 for v in verdicts)
    assert all(c.sign is None for s in compared for c in s.rows)
    assert "secondary, no verdict: datc vs uniform" in verdicts[0].text
    text = head_to_head_markdown(compared, SPEC.min_pairs, secondary=True)
    assert "## Against the published baselines (secondary)" in text
    assert "**Secondary**" in text and "**+**" not in text and "Holm" not in text
    # the same runs without a family: today's verdicts, Holm-corrected per setting
    plain = dataclasses.replace(SPEC, primary_family=None)
    _, verdicts = summarize(data, plain)
    verdicts, compared = judge(verdicts, head_to_head(data, plain, ["datc"], ["red"]), plain)
    assert all(v.sign == 1 for v in verdicts) and "**datc beats uniform**" in verdicts[0].text
    with pytest.raises(ValueError, match=r"spec\.primary_family"):
        primary_family(data, plain)


def _config(tmp_path: Path, family: dict[str, Any] | None) -> AblateConfig:
    return AblateConfig.model_validate(
        {
            "output_dir": str(tmp_path / "out"),
            "families": list(FAMILIES),
            "seeds": list(SEEDS),
            "strategies": [
                "uniform",
                {"label": "uniform_hi", "name": "uniform", "train": {"optim": {"lr": 1e-3}}},
                "datc",
                {"label": "p2t_m", "name": "p2t"},
            ],
            "method": "datc",
            "settings": {"toy": {"kind": "target_tokens", "primary": "eval_reward_sampled"}},
            "report": {} if family is None else {"primary_family": family},
        }
    )


def test_the_runner_writes_the_primary_family_first_and_the_rest_as_secondary(
    tmp_path: Path,
) -> None:
    """``write_outputs`` (the report step of the runner, reading the rows of an earlier
    results.csv) with a declared family, and with none: today's report."""
    values = curves()
    family = {
        "against_baseline": ["datc", "p2t_m"],
        "pairs": [["datc", "p2t_m"]],
        "baseline_best_of": ["uniform", "uniform_hi"],
    }
    cfg = _config(tmp_path, family)
    data = [
        r
        for r in rows(values)
        if r["setting"] == "toy" and r["strategy"] in ("uniform", "uniform_hi", "datc", "p2t_m")
    ]
    assert len(data) == len(plan_runs(cfg)) * len(STEPS)
    earlier = tmp_path / "earlier.csv"
    write_csv(earlier, data)
    outputs = write_outputs(cfg, command="test", earlier=[earlier])
    report = outputs.report.read_text()
    written = read_csv(outputs.csv)
    expected = primary_markdown(primary_family(written, summary_spec(cfg)), summary_spec(cfg))
    assert expected in report and "## Verdicts" not in report
    assert report.index("## Primary family") < report.index("(secondary)")
    assert "secondary, no verdict: datc vs uniform" in report
    plain = write_outputs(_config(tmp_path, None), command="test", earlier=[earlier])
    text = (plain.report.parent / REPORT_FILE).read_text()
    assert "## Verdicts" in text and "Primary family" not in text and "secondary" not in text


def test_the_committed_fidelity_report_is_its_primary_family_recomputed_from_its_rows() -> None:
    """docs/results/fidelity: the family declared in configs/ablate/fidelity.yaml (48
    contrasts, 12 pairs each), recomputed from the report's own results.csv, is the report's
    section word for word; its three `datc_mid` − matched-P2T wins are the ones the README's
    decision table cites, interval for interval."""
    cfg = load_ablate_config(REPO / "configs" / "ablate" / "fidelity.yaml")
    spec = summary_spec(cfg)
    folder = REPO / "docs" / "results" / "fidelity"
    result = primary_family(read_csv(folder / "results.csv"), spec)
    assert result.size == 48 and {c.diff.n for c in result.contrasts} == {12}
    assert primary_markdown(result, spec) in (folder / "report.md").read_text()
    better = {
        c.setting: c
        for c in result.contrasts
        if (c.contender, c.against) == ("datc_mid_lr1e-3", "p2t_matched_lr1e-3") and c.sign == 1
    }
    assert set(better) == {"proxy_05", "proxy_10", "binary"}
    rows = [line for line in (REPO / "README.md").read_text().splitlines() if "**better**" in line]
    for c in better.values():
        assert any(fmt_interval(c.diff, signed=True) in row for row in rows), c.setting
