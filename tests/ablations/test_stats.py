"""Statistics of the ablation report against hand-computed values.

Student-t quantiles (SciPy's) against the printed table;
mean / interval / paired difference on small fixed samples computed by hand, the paired
t-test's p against ``scipy.stats.ttest_rel``; Holm's adjusted p-values against a
hand-computed example, a hand-checked table, the step-down procedure itself and (where
installed) statsmodels' ``multipletests``; the exact sign-flip test against hand-counted
cases, brute-force enumeration and ``scipy.stats.permutation_test``; and the whole summary
(final reward, held-out metric, paired differences, steps to threshold, time per step,
verdict) on a fixed results.csv.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats as scipy_stats

from ablations.results import read_csv
from ablations.stats import (
    SIGN_FLIP_DRAWS,
    decide,
    holm,
    mean_interval,
    paired_difference,
    sign_flip_p,
    t_quantile,
)
from ablations.summary import (
    SettingSpec,
    SummarySpec,
    steps_to_threshold,
    summarize,
)

# t_{0.975, df} from a standard table (5 significant digits)
T975 = {1: 12.706, 2: 4.3027, 3: 3.1824, 4: 2.7764, 5: 2.5706, 9: 2.2622, 29: 2.0452}


@pytest.mark.parametrize(("df", "expected"), sorted(T975.items()))
def test_t_quantile_matches_the_table(df: int, expected: float) -> None:
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=6e-4)
    assert t_quantile(0.025, df) == pytest.approx(-expected, abs=6e-4)


def test_t_quantile_refuses_what_has_no_quantile() -> None:
    with pytest.raises(ValueError, match="p: expected a probability"):
        t_quantile(1.0, 3)
    with pytest.raises(ValueError, match="df: expected > 0"):
        t_quantile(0.9, 0)


def test_mean_interval_by_hand() -> None:
    # [1, 2, 3, 4]: mean 2.5, s = sqrt(5/3), se = s / 2, half = t_{0.975,3} * se
    half = 3.182446305284263 * math.sqrt(5 / 3) / 2
    iv = mean_interval([1.0, 2.0, 3.0, 4.0])
    assert (iv.mean, iv.n) == (2.5, 4)
    assert iv.low == pytest.approx(2.5 - half, abs=1e-9)
    assert iv.high == pytest.approx(2.5 + half, abs=1e-9)
    assert iv.excludes_zero() == 1  # [0.446, 4.554]
    # two values 0.1 and 0.3: mean 0.2, s = 0.1414.., half = 12.7062 * 0.1 = 1.2706
    two = mean_interval([0.1, 0.3])
    assert two.half_width == pytest.approx(12.706204736174694 * 0.1, abs=1e-9)
    # 90% interval is narrower: t_{0.95,3} = 2.353363
    assert mean_interval([1.0, 2.0, 3.0, 4.0], 0.90).half_width == pytest.approx(
        2.353363434801823 * math.sqrt(5 / 3) / 2, abs=1e-9
    )


def test_degenerate_samples() -> None:
    one = mean_interval([0.7])
    assert one.mean == 0.7 and one.n == 1 and math.isnan(one.low) and math.isnan(one.high)
    assert one.excludes_zero() == 0
    none = mean_interval([])
    assert none.n == 0 and math.isnan(none.mean)
    same = mean_interval([0.5, 0.5, 0.5])
    assert (same.low, same.high) == (0.5, 0.5)
    with pytest.raises(ValueError, match="finite"):
        mean_interval([1.0, float("nan")])


def test_paired_difference_uses_common_seeds_only() -> None:
    a = {0: 0.60, 1: 0.70, 2: 0.65, 7: 9.0}
    b = {0: 0.50, 1: 0.55, 2: 0.60, 5: -9.0}
    iv = paired_difference(a, b)  # differences 0.10, 0.15, 0.05
    sd = math.sqrt(((0.0) ** 2 + 0.05**2 + 0.05**2) / 2)
    half = 4.302652729749464 * sd / math.sqrt(3)
    assert iv.n == 3
    assert iv.mean == pytest.approx(0.10, abs=1e-12)
    assert iv.low == pytest.approx(0.10 - half, abs=1e-9)
    assert iv.excludes_zero() == 0  # [-0.024, 0.224]


def test_steps_to_threshold_uses_a_trailing_moving_average() -> None:
    curve = [(1, 0.0), (2, 1.0), (3, 0.0), (4, 1.0), (5, 1.0)]
    assert steps_to_threshold(curve, 0.5, smooth=1) == 2
    assert steps_to_threshold(curve, 0.6, smooth=2) == 5  # (1 + 1) / 2 at step 5
    assert steps_to_threshold(curve, 0.5, smooth=3) == 4  # (1 + 0 + 1) / 3 = 0.667 at step 4
    assert steps_to_threshold(curve, 2.0, smooth=1) is None


# A fixed results.csv: one setting, one family, 2 strategies x 2 seeds, 3 steps each
# (step 0 = held-out evaluation of the initial policy).
FIXED_CSV = """\
setting,family,strategy,seed,step,reward_mean,eval_reward_sampled,eval_reward_greedy,time_step,time_rollout,time_signals,time_update,wall_s,peak_rss_mb
toy,llama,uniform,0,0,,0.10,0.20,,,,,5.0,100
toy,llama,uniform,0,1,0.10,,,9.0,3.0,3.0,3.0,5.0,100
toy,llama,uniform,0,2,0.20,,,1.0,0.5,0.2,0.3,5.0,100
toy,llama,uniform,0,3,0.30,0.30,0.40,3.0,1.5,0.6,0.9,5.0,100
toy,llama,uniform,1,0,,0.10,0.20,,,,,6.0,110
toy,llama,uniform,1,1,0.20,,,9.0,3.0,3.0,3.0,6.0,110
toy,llama,uniform,1,2,0.20,,,1.0,0.5,0.2,0.3,6.0,110
toy,llama,uniform,1,3,0.40,0.50,0.60,3.0,1.5,0.6,0.9,6.0,110
toy,llama,datc,0,0,,0.10,0.20,,,,,7.0,120
toy,llama,datc,0,1,0.10,,,9.0,3.0,3.0,3.0,7.0,120
toy,llama,datc,0,2,0.50,,,2.0,1.0,0.5,0.5,7.0,120
toy,llama,datc,0,3,0.70,0.60,0.50,2.0,1.0,0.5,0.5,7.0,120
toy,llama,datc,1,0,,0.10,0.20,,,,,8.0,130
toy,llama,datc,1,1,0.20,,,9.0,3.0,3.0,3.0,8.0,130
toy,llama,datc,1,2,0.40,,,2.0,1.0,0.5,0.5,8.0,130
toy,llama,datc,1,3,0.60,0.70,0.80,2.0,1.0,0.5,0.5,8.0,130
"""


def test_summary_of_a_fixed_csv(tmp_path: Path) -> None:
    path = tmp_path / "results.csv"
    path.write_text(FIXED_CSV)
    spec = SummarySpec(
        settings=[SettingSpec("toy", "toy setting", "eval_reward_sampled", "reward", None)],
        strategies=["uniform", "datc"],
        baseline="uniform",
        method="datc",
        control=None,
        final_window=2,
        smooth=1,
        min_pairs=2,  # the two seeds of this toy csv
    )
    tables, verdicts = summarize(read_csv(path), spec)
    assert len(tables) == 1 and tables[0].family == "llama"
    uni, datc = tables[0].strategies["uniform"], tables[0].strategies["datc"]
    t1 = 12.706204736174694
    # final train reward = mean of the last 2 steps: uniform 0.25 and 0.30; datc 0.60 and 0.50
    assert uni.final_train.mean == pytest.approx(0.275)
    assert uni.final_train.half_width == pytest.approx(t1 * 0.025, abs=1e-9)
    assert datc.final_train.mean == pytest.approx(0.55)
    # held-out (last evaluation): uniform 0.3, 0.5; datc 0.6, 0.7; greedy uniform 0.4, 0.6
    assert uni.primary.mean == pytest.approx(0.4)
    assert uni.held_greedy.mean == pytest.approx(0.5)
    assert datc.held_sampled.mean == pytest.approx(0.65)
    # paired differences per seed: held-out 0.3 and 0.2; final train 0.35 and 0.20
    assert datc.diff_primary is not None and datc.diff_train is not None
    assert datc.diff_primary.mean == pytest.approx(0.25)
    assert datc.diff_primary.half_width == pytest.approx(t1 * 0.05, abs=1e-9)
    assert datc.diff_train.mean == pytest.approx(0.275)
    assert uni.diff_primary is None
    # automatic threshold: step-1 reward 0.15 + half the gap to the best final mean 0.55
    assert tables[0].threshold == pytest.approx(0.35)
    assert uni.steps_to_threshold == [None, 3]
    assert datc.steps_to_threshold == [2, 2]
    # time per step leaves out step 1: uniform mean of (1, 3) twice = 2.0
    assert uni.cost.time_step == pytest.approx(2.0)
    assert uni.cost.time_rollout == pytest.approx(1.0)
    assert datc.cost.time_signals == pytest.approx(0.5)
    assert math.isnan(datc.cost.time_signals_reward)  # a csv written before that column
    assert uni.cost.peak_rss_mb == 110 and datc.cost.wall_s == pytest.approx(7.5)
    # one verdict, worded from the interval (0.25 +- 0.635 contains 0)
    (verdict,) = verdicts
    assert verdict.vs_baseline.mean == pytest.approx(0.25)
    assert "no significant difference" in verdict.text
    assert "held-out reward (primary metric `eval_reward_sampled`) 0.650 vs 0.400" in verdict.text
    assert "+0.250" in verdict.text
    assert "(95% CI -0.385 to +0.885, n=2 family x seed pairs; interval unadjusted)" in verdict.text
    assert "Holm-corrected over 1 contrast in this setting" in verdict.text
    # and the report prints exactly those numbers
    from ablations.report import table_markdown

    md = table_markdown(tables[0], spec, "reward", True)
    assert "0.275 [-0.043, 0.593]" in md  # datc's final train reward, mean [95% CI]
    assert "+0.250 [-0.385, +0.885]" in md  # its paired held-out difference to uniform


def three_separated_pairs() -> list[dict[str, Any]]:
    """Three seeds on which datc is clearly above uniform (held-out +0.20 on average)."""
    return [
        {
            "setting": "toy",
            "family": "gpt2",
            "strategy": strat,
            "seed": seed,
            "step": 1,
            "reward_mean": value,
            "eval_reward_sampled": value,
        }
        for seed, (u, d) in enumerate([(0.30, 0.50), (0.40, 0.61), (0.35, 0.54)])
        for strat, value in (("uniform", u), ("datc", d))
    ]


TOY_SPEC = SummarySpec(
    settings=[SettingSpec("toy", "toy", "eval_reward_sampled", "reward", 0.2)],
    strategies=["uniform", "datc"],
    baseline="uniform",
    method="datc",
    control=None,
)


def test_verdict_says_better_or_worse_only_when_the_interval_excludes_zero() -> None:
    rows = three_separated_pairs()
    spec = dataclasses.replace(TOY_SPEC, min_pairs=3)  # the three seeds of these rows
    _, (better,) = summarize(rows, spec)
    assert better.vs_baseline.excludes_zero() == 1 and "**datc beats uniform**" in better.text
    flipped = [
        {**r, "strategy": {"uniform": "datc", "datc": "uniform"}[r["strategy"]]} for r in rows
    ]
    _, (worse,) = summarize(flipped, spec)
    assert "**datc is worse than uniform**" in worse.text


def test_no_verdict_from_fewer_pairs_than_min_pairs() -> None:
    """Three clearly separated pairs: a verdict at min_pairs = 3, none at the default (6):
    the numbers are shown, the verdict says too few pairs, and the tally counts it apart."""
    from ablations.report import _tally

    rows, spec = three_separated_pairs(), TOY_SPEC
    assert spec.min_pairs == 6
    _, (verdict,) = summarize(rows, spec)
    assert verdict.sign is None and "beats" not in verdict.text
    assert "too few pairs for a verdict on datc vs uniform (n=3 < 6)" in verdict.text
    assert "+0.200 (95% CI" in verdict.text  # the numbers are still there
    assert _tally([verdict], spec) == (
        "In sum: `datc` beats `uniform` in 0 of 1 settings, is worse in 0, and is not "
        "distinguishable from it in 0; 1 had too few pairs for a verdict (fewer than 6)."
    )
    _, (decided,) = summarize(rows, dataclasses.replace(spec, min_pairs=3))
    assert decided.sign == 1 and "**datc beats uniform**" in decided.text


def test_the_paired_t_test_p_value_is_scipys_and_agrees_with_the_interval() -> None:
    a = {0: 0.61, 1: 0.70, 2: 0.66, 3: 0.52, 4: 0.58}
    b = {0: 0.50, 1: 0.55, 2: 0.60, 3: 0.51, 4: 0.49}
    iv = paired_difference(a, b)
    expected = scipy_stats.ttest_rel([a[k] for k in a], [b[k] for k in a]).pvalue
    assert iv.p == pytest.approx(float(expected), rel=1e-9)
    for confidence in (0.8, 0.9, 0.95, 0.99):  # p < 1 - c exactly when 0 is outside
        ci = paired_difference(a, b, confidence)
        assert (ci.p < 1 - confidence) == (ci.excludes_zero() != 0)
    assert mean_interval([0.2, 0.2]).p == 0.0 and mean_interval([0.0, 0.0]).p == 1.0
    assert math.isnan(mean_interval([0.3]).p)


def test_holm_by_hand() -> None:
    # sorted: 0.005 (x4 = 0.02), 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04 -> 0.06)
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    with pytest.raises(ValueError, match="p_values: expected probabilities"):
        holm([0.1, float("nan")])


#: A hand-checked table: p-values -> Holm-adjusted p-values (each adjusted value written out
#: from the definition: sort, multiply by m - rank, running maximum, cap at 1).
HOLM_TABLE = [
    ([0.02], [0.02]),
    ([0.5, 0.6], [1.0, 1.0]),  # 2 x 0.5 = 1.0, then max(1.0, 0.6)
    ([0.01, 0.02, 0.03], [0.03, 0.04, 0.04]),  # 3 x 0.01, 2 x 0.02, max(0.04, 0.03)
    ([0.04, 0.001, 0.2, 0.012], [0.08, 0.004, 0.2, 0.036]),  # 4x.001, 3x.012, 2x.04, 1x.2
    ([0.3, 0.3, 0.001], [0.6, 0.6, 0.003]),  # ties: 2 x 0.3, then max(0.6, 0.3)
    ([], []),
]


@pytest.mark.parametrize(("p", "adjusted"), HOLM_TABLE)
def test_holm_matches_the_hand_checked_table(p: list[float], adjusted: list[float]) -> None:
    assert holm(p) == pytest.approx(adjusted, abs=1e-12)


def _step_down_rejects(p: list[float], alpha: float) -> set[int]:
    """Holm's procedure itself: test the hypotheses from the smallest p up, rejecting the
    k-th (k = 0, 1, ...) while (m - k) p <= alpha; stop at the first that is kept."""
    rejected: set[int] = set()
    for k, i in enumerate(sorted(range(len(p)), key=lambda j: p[j])):
        if (len(p) - k) * p[i] > alpha:
            break
        rejected.add(i)
    return rejected


def test_holm_adjusted_p_is_the_smallest_level_at_which_the_step_down_rejects() -> None:
    """The adjusted p of a hypothesis is the smallest alpha at which Holm's step-down
    procedure rejects it; the procedure changes only at the levels (m - k) p_(k)."""
    gen = np.random.default_rng(0)
    for _ in range(50):
        p = list(gen.uniform(0, 0.2, size=int(gen.integers(1, 7))))
        levels = sorted({min(1.0, (len(p) - k) * x) for k, x in enumerate(sorted(p))} | {1.0})
        smallest = [min(a for a in levels if i in _step_down_rejects(p, a)) for i in range(len(p))]
        assert holm(p) == pytest.approx(smallest, abs=1e-12)


def test_holm_matches_statsmodels_multipletests() -> None:
    multitest = pytest.importorskip("statsmodels.stats.multitest")
    gen = np.random.default_rng(1)
    for m in (1, 2, 5, 12):
        p = gen.uniform(0, 0.3, size=m)
        _, adjusted, _, _ = multitest.multipletests(p, alpha=0.05, method="holm")
        assert holm(list(p)) == pytest.approx(list(adjusted), abs=1e-12)


def test_decide_corrects_over_the_contrasts_with_enough_pairs_only() -> None:
    clear = mean_interval([0.30, 0.32, 0.28, 0.31, 0.29, 0.30])  # p ~ 1e-8
    borderline = mean_interval([0.08, 0.02, 0.10, 0.05, 0.09, 0.01])  # p ~ 0.013
    few = mean_interval([0.5, 0.6, 0.55])  # 3 pairs: no verdict, not in the family
    assert 0.05 / 5 < borderline.p < 0.05 / 2
    alone = decide([borderline], min_pairs=6, alpha=0.05)
    assert alone[0].sign == 1 and alone[0].p_holm == pytest.approx(borderline.p)
    decided = decide([clear, borderline, few], min_pairs=6, alpha=0.05)
    assert [d.family for d in decided] == [2, 2, 2]
    assert decided[1].p_holm == pytest.approx(max(2 * clear.p, borderline.p))
    assert decided[0].sign == 1 and decided[1].sign == 1  # p_(2) x 1
    assert decided[2].sign is None and math.isnan(decided[2].p_holm)
    # five borderline contrasts: 5 x p ~ 0.063 for the smallest, none stands
    five = decide([borderline] * 5, min_pairs=6, alpha=0.05)
    assert [d.sign for d in five] == [0] * 5
    assert five[0].p_holm == pytest.approx(5 * borderline.p)
    with pytest.raises(ValueError, match="min_pairs"):
        decide([clear], min_pairs=1, alpha=0.05)


def test_a_verdict_the_interval_alone_would_give_is_withdrawn_by_the_correction() -> None:
    """The method is above the baseline at p ~ 0.013 (its unadjusted interval excludes 0),
    but the setting has four more contrasts that are no more significant: Holm says tie."""
    from ablations.contrasts import judge
    from ablations.head_to_head import head_to_head

    diffs = [0.08, 0.02, 0.10, 0.05, 0.09, 0.01]
    rows = []
    for seed, d in enumerate(diffs):
        for strategy, value in (
            ("uniform", 0.40),
            ("datc", 0.40 + d),
            ("red", 0.40),
            ("abc", 0.40),
        ):
            rows.append(
                {
                    "setting": "toy",
                    "family": "gpt2",
                    "strategy": strategy,
                    "seed": seed,
                    "step": 1,
                    "reward_mean": value,
                    "eval_reward_sampled": value,
                }
            )
    spec = dataclasses.replace(TOY_SPEC, strategies=["uniform", "datc", "red", "abc"])
    _, (alone,) = summarize(rows, spec)
    assert alone.sign == 1 and alone.vs_baseline.excludes_zero() == 1
    compared = head_to_head(rows, spec, ["datc"], ["red", "abc"])
    (verdict,), (setting,) = judge([alone], compared, spec)
    # method vs uniform, datc vs red and vs abc (all and gpt2): 5 contrasts of 6 pairs;
    # the best baseline is judged on 3 pairs only (seeds 3-5): not a member
    assert verdict.contrasts == 5 == setting.contrasts
    assert verdict.sign == 0 and verdict.p_holm == pytest.approx(min(1.0, 5 * alone.vs_baseline.p))
    assert "**no significant difference** between datc and uniform" in verdict.text
    assert "Holm-corrected over 5 contrasts in this setting" in verdict.text
    assert all(c.sign == 0 for c in setting.rows)


def _brute_sign_flip(d: list[float]) -> float:
    """The sign-flip p by listing every sign assignment (docs/design.md, "Evaluation")."""
    observed = abs(sum(d))
    signs = list(itertools.product((1.0, -1.0), repeat=len(d)))
    hits = sum(
        abs(sum(s * x for s, x in zip(flips, d, strict=True))) >= observed - 1e-12
        for flips in signs
    )
    return hits / len(signs)


def test_sign_flip_p_by_hand() -> None:
    # +-1 +-2 +-3: sums 6, 4, 2, 0, 0, -2, -4, -6: |S| >= 6 twice in 8
    assert sign_flip_p([1.0, 2.0, 3.0]) == 2 / 8
    # -1 +2 +4 = 5: the odd sums +-7, +-5 reach it: 4 of 8
    assert sign_flip_p([-1.0, 2.0, 4.0]) == 4 / 8
    # all of one sign: only the observed assignment and its mirror, the floor 2 / 2^n
    assert sign_flip_p([0.1 * (i + 1) for i in range(12)]) == 2 / 2**12
    # a zero difference flips onto itself: the floor is over the nonzero ones
    assert sign_flip_p([0.0, 0.3, 0.5]) == 2 * 2 / 8
    assert sign_flip_p([0.0, 0.0]) == 1.0  # no difference at all
    assert sign_flip_p([0.2, -0.2]) == 1.0  # mean 0: every assignment is as extreme
    assert math.isnan(sign_flip_p([]))
    with pytest.raises(ValueError, match="diffs: expected finite"):
        sign_flip_p([0.1, float("nan")])


def test_sign_flip_p_counts_every_assignment_like_brute_force() -> None:
    gen = np.random.default_rng(4)
    for n in (1, 2, 5, 8, 11):
        for shift in (0.0, 0.4, 1.5):
            d = list(gen.normal(shift, 1.0, size=n))
            assert sign_flip_p(d) == pytest.approx(_brute_sign_flip(d), abs=1e-15)
    ties = [0.1, 0.1, 0.2, -0.1, 0.3, 0.2]  # many equal sums: each tie counts as extreme
    assert sign_flip_p(ties) == pytest.approx(_brute_sign_flip(ties), abs=1e-15)


def test_sign_flip_p_is_scipys_exact_paired_permutation_test() -> None:
    """``scipy.stats.permutation_test`` with ``permutation_type='samples'`` swaps a and b
    within each pair, i.e. flips the sign of each difference; with ``n_resamples=inf`` it
    lists all 2^n."""
    gen = np.random.default_rng(7)
    for n in (2, 4, 7, 12):
        a, b = gen.normal(0.5, 0.2, size=n), gen.normal(0.45, 0.2, size=n)
        ref = scipy_stats.permutation_test(
            (a, b),
            lambda x, y, axis: np.mean(x - y, axis=axis),
            permutation_type="samples",
            n_resamples=np.inf,
            vectorized=True,
        )
        assert sign_flip_p(list(a - b)) == pytest.approx(ref.pvalue, rel=1e-12)


def test_sign_flip_p_above_the_exact_limit_draws_assignments() -> None:
    """Above ``exact_max`` pairs the p is a Monte Carlo estimate; checked at a size still
    counted exactly: it lands within 4 standard errors of the exact p and is never 0."""
    d = list(np.random.default_rng(3).normal(0.3, 1.0, size=20))
    exact = sign_flip_p(d)
    drawn = sign_flip_p(d, exact_max=10)
    se = math.sqrt(exact * (1 - exact) / SIGN_FLIP_DRAWS)
    assert abs(drawn - exact) < 4 * se + 1 / SIGN_FLIP_DRAWS
    assert sign_flip_p([1.0] * 45) == 1 / (1 + SIGN_FLIP_DRAWS)  # no draw hits 2 / 2^45
