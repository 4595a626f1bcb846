"""Sweeps (``ablations.sweeps``): settings of one kind that differ in one numeric parameter
are put side by side, each strategy's paired difference to the baseline against that
parameter, in a table and a figure; any other group of settings is no sweep, unless the
config declares it (``report.sweeps``): then its axis is a measured figure of the settings'
direction models, and a bad declaration is refused at load naming the field."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from ablations.ablation_config import load_ablate_config
from ablations.figures import is_png, plot_sweep
from ablations.results import RunKey, read_csv
from ablations.runner import config_sweeps, summary_spec
from ablations.sample_fidelity import SettingFidelity, setting_fidelity
from ablations.stats import paired_difference
from ablations.summary import SettingSpec, SummarySpec
from ablations.sweeps import Sweep, find_sweeps, measured_sweep, sweep_markdown, sweep_table
from backends.common.errors import ConfigError
from tests.helpers.paths import REPO

LENGTH = "length_sweep"


def test_settings_of_one_kind_moving_one_number_are_a_sweep_in_increasing_order() -> None:
    settings = {
        "long": (LENGTH, {"response_len": 192, "positions": 4}),
        "short": (LENGTH, {"response_len": 24, "positions": 4}),
        "mid": (LENGTH, {"response_len": 96, "positions": 4}),
        "other": ("preference", {"response_len": 24}),
    }
    primary = dict.fromkeys(settings, "eval_reward_sampled")
    assert find_sweeps(settings, primary) == [
        Sweep(LENGTH, "response_len", ("short", "mid", "long"), (24.0, 96.0, 192.0))
    ]


@pytest.mark.parametrize(
    ("params", "primaries"),
    [
        ([{"n": 24, "k": 4}, {"n": 96, "k": 8}], ["m", "m"]),  # two parameters move at once
        ([{"n": 24}, {"n": 96}], ["m", "other_metric"]),  # judged on different metrics
        ([{"n": "short"}, {"n": "long"}], ["m", "m"]),  # the moving parameter is no number
        ([{"n": True}, {"n": False}], ["m", "m"]),  # a flag is no number
        ([{"n": 24}, {"n": 24}], ["m", "m"]),  # nothing moves
        ([{"n": 24}], ["m"]),  # one setting
    ],
)
def test_any_other_group_of_one_kind_is_no_sweep(
    params: list[dict[str, object]], primaries: list[str]
) -> None:
    names = [f"s{i}" for i in range(len(params))]
    settings = {n: (LENGTH, p) for n, p in zip(names, params, strict=True)}
    assert find_sweeps(settings, dict(zip(names, primaries, strict=True))) == []


SPEC = SummarySpec(
    settings=[SettingSpec(name, name, "eval_reward_sampled", "reward") for name in ("n24", "n96")],
    strategies=["uniform", "datc", "red", "never"],
    baseline="uniform",
    method="datc",
    control=None,
)
SWEEP = Sweep(LENGTH, "response_len", ("n24", "n96"), (24.0, 96.0))
#: (setting, strategy) -> held-out reward of seeds 0, 1, 2 (family llama); red did not run at 96.
VALUES = {
    ("n24", "uniform"): [0.30, 0.35, 0.40],
    ("n24", "datc"): [0.41, 0.43, 0.52],
    ("n24", "red"): [0.25, 0.36, 0.38],
    ("n96", "uniform"): [0.10, 0.20, 0.12],
    ("n96", "datc"): [0.31, 0.36, 0.30],
}


def rows() -> list[dict[str, Any]]:
    return [
        {
            "setting": setting,
            "family": "llama",
            "strategy": strategy,
            "seed": seed,
            "step": 5,
            "eval_reward_sampled": value,
        }
        for (setting, strategy), values in VALUES.items()
        for seed, value in enumerate(values)
    ]


def test_each_strategy_minus_the_baseline_at_each_point_paired_over_seeds() -> None:
    table = sweep_table(rows(), SPEC, SWEEP)
    assert table.baseline_means == pytest.approx((0.35, 0.14)) and table.metric_label == "reward"
    assert [c.strategy for c in table.curves] == ["datc", "red"]  # `never` ran nowhere
    datc, red = table.curves
    for i, setting in enumerate(SWEEP.settings):
        by_hand = paired_difference(
            dict(enumerate(VALUES[(setting, "datc")])),
            dict(enumerate(VALUES[(setting, "uniform")])),
        )
        diff = datc.diffs[i]
        assert diff is not None
        assert (diff.mean, diff.low, diff.high) == pytest.approx(
            (by_hand.mean, by_hand.low, by_hand.high)
        )
    assert red.diffs[0] is not None and red.diffs[1] is None  # red did not run at 96


def test_the_section_has_a_column_per_value_and_a_row_per_strategy(tmp_path: Path) -> None:
    table = sweep_table(rows(), SPEC, SWEEP)
    figure = plot_sweep(tmp_path / "sweep.png", table)
    assert is_png(figure)
    text = sweep_markdown([table], ["figures/sweep.png"])
    assert "| strategy | response_len = 24 (`n24`) | response_len = 96 (`n96`) |" in text
    assert "| `uniform` (mean) | 0.350 | 0.140 |" in text
    datc = table.curves[0].diffs[0]
    assert datc is not None and f"| `datc` - `uniform` | {datc.mean:+.3f} [" in text
    assert "| `red` - `uniform` | " in text and text.count("n/a") == 1
    assert "![sweep length_sweep](figures/sweep.png)" in text


def test_the_committed_evidence_report_sweeps_the_length_task() -> None:
    """The report of configs/ablate/evidence.yaml carries the length sweep's table, and its
    cells are the sweep recomputed from the report's own results.csv."""
    cfg = load_ablate_config(REPO / "configs" / "ablate" / "evidence.yaml")
    spec = summary_spec(cfg)
    folder = REPO / "docs" / "results" / "evidence"
    (sweep,) = config_sweeps(cfg)
    assert sweep.settings == ("sweep_24", "sweep_96", "sweep_192")
    table = sweep_table(read_csv(folder / "results.csv"), spec, sweep)
    report = (folder / "report.md").read_text()
    for curve in table.curves:
        cells = " | ".join(f"{d.mean:+.3f} [{d.low:+.3f}, {d.high:+.3f}]" for d in curve.diffs if d)
        assert f"| `{curve.strategy}` - `uniform` | {cells} |" in report
    assert is_png(folder / "figures" / "sweep_length_sweep.png")


def test_with_grpos_row_picked_per_point_each_strategy_is_against_that_points_pick(
    tmp_path: Path,
) -> None:
    """The primary family picks GRPO's row among its learning rates per setting
    (``primary.PrimaryResult.grpo_rows``): at each point the baseline is that point's pick,
    and a candidate gets no difference where it is the pick."""
    rows_hi = [
        {**r, "strategy": "uniform_hi", "eval_reward_sampled": r["eval_reward_sampled"] + 0.1}
        for r in rows()
        if r["strategy"] == "uniform"
    ]
    spec = SummarySpec(
        settings=SPEC.settings,
        strategies=["uniform", "uniform_hi", "datc", "red"],
        baseline="uniform",
        method="datc",
        control=None,
    )
    grpo = {"n24": "uniform_hi", "n96": "uniform"}
    table = sweep_table([*rows(), *rows_hi], spec, SWEEP, grpo)
    assert table.rows == ("uniform_hi", "uniform") and table.baseline == "GRPO"
    assert table.baseline_means == pytest.approx((0.45, 0.14))
    curves = {c.strategy: c.diffs for c in table.curves}
    assert list(curves) == ["uniform", "uniform_hi", "datc", "red"]
    for i, (setting, pick) in enumerate(grpo.items()):
        by_hand = paired_difference(
            dict(enumerate(VALUES[(setting, "datc")])),
            dict(
                enumerate(
                    x + (0.1 if pick == "uniform_hi" else 0.0) for x in VALUES[(setting, "uniform")]
                )
            ),
        )
        diff = curves["datc"][i]
        assert diff is not None and diff.mean == pytest.approx(by_hand.mean)
    assert curves["uniform"][1] is None and curves["uniform_hi"][0] is None  # the picks
    uniform_at_24 = curves["uniform"][0]
    assert uniform_at_24 is not None and uniform_at_24.mean == pytest.approx(-0.1)
    text = sweep_markdown([table], ["figures/sweep.png"], secondary=True)
    assert (
        "| GRPO (mean; its row at each point) | 0.450 (`uniform_hi`) | 0.140 (`uniform`) |" in text
    )
    assert "| `uniform` - GRPO | -0.100 [" in text and "| GRPO's row |" in text
    assert "**Secondary**: the verdicts are the primary family's" in text
    assert is_png(plot_sweep(tmp_path / "sweep.png", table))


# --- declared sweeps over a measured axis (report.sweeps) --------------------------------


def _fidelity(corr: dict[str, list[float]]) -> dict[str, SettingFidelity]:
    """setting -> its RMs' correlations on the policy's samples, one per seed (llama)."""
    data = {
        RunKey(setting, "llama", "uniform", seed): {
            "info": {
                "policy_samples": {
                    "rm_corr": c,
                    "rm_pair_accuracy": 0.9,
                    "entropy": 3.0,
                    "log_vocab": 4.0,
                }
            }
        }
        for setting, values in corr.items()
        for seed, c in enumerate(values)
    }
    return setting_fidelity(data, ["llama"], model_seeds=True)


def test_a_declared_sweep_is_ordered_by_the_measured_mean_with_its_range(tmp_path: Path) -> None:
    """n24 and n96 stand for two settings whose RMs differ: n96's correlations 0.9, 0.7 and
    0.8 (mean 0.8) put it before n24's 0.95, 0.97, 0.99 (mean 0.97); each point is each
    strategy minus the baseline there, as for a numeric sweep."""
    fidelity = _fidelity({"n24": [0.95, 0.97, 0.99], "n96": [0.9, 0.7, 0.8]})
    sweep = measured_sweep("fid", LENGTH, ["n24", "n96"], "rm_corr", fidelity)
    assert sweep.settings == ("n96", "n24") and sweep.name == sweep.label == "fid"
    assert sweep.values == pytest.approx((0.8, 0.97))
    assert sweep.spans == ((0.7, 0.9), (0.95, 0.99))  # min and max: the values themselves
    table = sweep_table(rows(), SPEC, sweep)
    assert table.baseline_means == pytest.approx((0.14, 0.35))  # n96's, then n24's
    datc = table.curves[0]
    for i, setting in enumerate(sweep.settings):
        by_hand = paired_difference(
            dict(enumerate(VALUES[(setting, "datc")])),
            dict(enumerate(VALUES[(setting, "uniform")])),
        )
        diff = datc.diffs[i]
        assert diff is not None and diff.mean == pytest.approx(by_hand.mean)
    # by hand: n96 datc - uniform = 0.21, 0.16, 0.18 (mean 0.183); n24: 0.11, 0.08, 0.12
    assert datc.diffs[0] is not None and datc.diffs[0].mean == pytest.approx(0.55 / 3)
    assert datc.diffs[1] is not None and datc.diffs[1].mean == pytest.approx(0.31 / 3)
    text = sweep_markdown([table], ["figures/sweep_fid.png"])
    assert "### `fid`: `length_sweep` against measured `rm_corr`" in text
    assert (
        "| strategy | rm_corr = 0.800 (0.700 to 0.900) (`n96`) "
        "| rm_corr = 0.970 (0.950 to 0.990) (`n24`) |"
    ) in text
    assert "| `datc` - `uniform` | +0.183 [" in text
    assert "![sweep fid](figures/sweep_fid.png)" in text
    assert is_png(plot_sweep(tmp_path / "sweep_fid.png", table))


def test_a_declared_sweep_needs_every_settings_measurement() -> None:
    fidelity = _fidelity({"n24": [0.95], "n96": [math.nan]})  # a constant RM: NaN only
    with pytest.raises(ValueError, match=r"sweep 'fid': settings \['n96', 'n48'\] have no"):
        measured_sweep("fid", LENGTH, ["n24", "n96", "n48"], "rm_corr", fidelity)


def _declared(tmp_path: Path, sweeps: list[dict[str, object]]) -> Path:
    length = {"kind": "length_sweep", "primary": "eval_reward_sampled"}
    data = {
        "strategies": ["uniform", "datc"],
        "settings": {
            "exact": {**length, "params": {"response_len": 24}},
            "proxy": {**length, "params": {"response_len": 24, "rm_proxy": 1.0}},
            "greedy": {**length, "params": {"response_len": 24}, "primary": "eval_reward_greedy"},
            "preference": {},
        },
        "report": {"sweeps": sweeps},
    }
    path = tmp_path / "ablate.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    ("sweep", "message"),
    [
        (
            {"name": "f", "settings": ["exact", "proxi"], "axis": "rm_corr"},
            r"report\.sweeps\.0\.settings: \['proxi'\] are not settings of this config",
        ),
        (
            {"name": "f", "settings": ["exact", "preference"], "axis": "rm_corr"},
            r"report\.sweeps\.0\.settings: expected settings of one kind, got kinds "
            r"\['length_sweep', 'preference'\]",
        ),
        (
            {"name": "f", "settings": ["exact", "greedy"], "axis": "rm_corr"},
            r"report\.sweeps\.0\.settings: expected settings judged on one primary metric",
        ),
        (
            {"name": "f", "settings": ["exact", "exact"], "axis": "rm_corr"},
            r"report\.sweeps\.0\.settings: .* names a setting twice",
        ),
        ({"name": "f", "settings": ["exact"], "axis": "rm_corr"}, r"report\.sweeps\.0\.settings"),
        (
            {"name": "f", "settings": ["exact", "proxy"], "axis": "entropy"},
            r"report\.sweeps\.0\.axis.*expected one of \['rm_corr', 'rm_pair_accuracy'\]",
        ),
        (
            {"name": "length_sweep", "settings": ["exact", "proxy"], "axis": "rm_corr"},
            r"report\.sweeps\.0\.name: 'length_sweep' is another sweep's or a setting kind's",
        ),
        ({"name": "a/b", "settings": ["exact", "proxy"], "axis": "rm_corr"}, r"sweeps\.0\.name"),
        ({"name": "f", "settings": ["exact", "proxy"]}, r"report\.sweeps\.0\.axis"),
    ],
)
def test_a_bad_declared_sweep_is_refused_at_load_naming_the_field(
    tmp_path: Path, sweep: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_ablate_config(_declared(tmp_path, [sweep]))


def test_a_sweep_declared_twice_is_refused_and_fidelity_yaml_declares_its_two(
    tmp_path: Path,
) -> None:
    decl = {"name": "f", "settings": ["exact", "proxy"], "axis": "rm_corr"}
    with pytest.raises(ConfigError, match=r"report\.sweeps\.1\.name: 'f' is another sweep's"):
        load_ablate_config(_declared(tmp_path, [decl, decl]))
    cfg = load_ablate_config(REPO / "configs" / "ablate" / "fidelity.yaml")
    assert [(s.name, s.settings, s.axis) for s in cfg.report.sweeps] == [
        ("fidelity_length", ["sweep_96", "proxy_05", "proxy_10", "binary"], "rm_corr"),
        ("fidelity_preference", ["preference", "pref_1500", "pref_500"], "rm_corr"),
    ]
    assert config_sweeps(cfg) == []  # none of its groups moves one number: declared only
