"""The direction model's fidelity on the policy's own samples in the report
(``ablations.sample_fidelity``; docs/design.md, "Evaluation"): one record per (policy, RM)
pair however many strategies ran on it, each setting's mean and range per family and over
all, the "Direction models" table with its numbers by hand, and the report the runner's own
``write_outputs`` writes from result.json files that carry the record and from older ones
that do not (no table there), with a declared sweep over the measured correlation."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from ablations.ablation_config import AblateConfig
from ablations.figures import is_png
from ablations.results import RunKey, write_result
from ablations.runner import plan_runs, run_fingerprint, write_outputs
from ablations.sample_fidelity import ALL, fidelity_markdown, setting_fidelity
from backends.common.errors import ConfigError

FAMILIES = ("llama", "gpt2")
SEEDS = (0, 1, 2)
#: (setting, family) -> per seed (rm_corr, rm_pair_accuracy, entropy); log V = 4 everywhere.
FITS: dict[tuple[str, str], list[tuple[float, float, float]]] = {
    ("hi", "llama"): [(0.97, 0.98, 3.80), (0.95, 0.96, 3.84), (0.99, 0.97, 3.88)],
    ("hi", "gpt2"): [(0.91, 0.90, 2.00), (0.93, 0.94, 2.20), (0.92, 0.92, 2.40)],
    ("lo", "llama"): [(0.40, 0.70, 3.80), (0.50, 0.80, 3.80), (math.nan, 0.75, 3.80)],
    ("lo", "gpt2"): [(0.30, 0.60, 2.00), (0.20, 0.65, 2.00), (0.40, 0.70, 2.00)],
}
LOG_V = 4.0


def fit(setting: str, family: str, seed: int) -> dict[str, float]:
    corr, acc, entropy = FITS[(setting, family)][seed]
    return {
        "samples": 64.0,
        "entropy": entropy,
        "log_vocab": LOG_V,
        "exact_mean": 0.05,
        "rm_corr": corr,
        "rm_pair_accuracy": acc,
    }


def results(strategies: tuple[str, ...] = ("uniform", "datc")) -> dict[RunKey, dict[str, Any]]:
    """Every strategy of one (setting, family, seed) shares its policy and RM: one record.
    Setting ``old`` ran before the record existed."""
    out: dict[RunKey, dict[str, Any]] = {}
    for setting in ("hi", "lo", "old"):
        for family in FAMILIES:
            for seed in SEEDS:
                info = {} if setting == "old" else {"policy_samples": fit(setting, family, seed)}
                for strategy in strategies:
                    out[RunKey(setting, family, strategy, seed)] = {"info": info}
    return out


def test_each_setting_per_family_and_over_all_by_hand() -> None:
    fidelity = setting_fidelity(results(), FAMILIES, model_seeds=True)
    assert set(fidelity) == {"hi", "lo"}  # `old` records nothing: no table
    hi = fidelity["hi"]
    assert [r.family for r in hi.rows] == ["llama", "gpt2", ALL]
    llama, gpt2, every = hi.rows
    assert (llama.pairs, gpt2.pairs, every.pairs) == (3, 3, 6)  # not 6, 6, 12: one per pair
    assert (llama.rm_corr.mean, llama.rm_corr.low, llama.rm_corr.high) == pytest.approx(
        (0.97, 0.95, 0.99)
    )
    assert llama.rm_pair_accuracy.mean == pytest.approx(0.97)
    assert (llama.entropy.mean, gpt2.entropy.mean) == pytest.approx((3.84, 2.2))
    # entropy / log V per pair: 0.95, 0.96, 0.97 and 0.50, 0.55, 0.60
    assert (llama.entropy_share.mean, llama.entropy_share.low) == pytest.approx((0.96, 0.95))
    assert gpt2.entropy_share.high == pytest.approx(0.6)
    # over all six pairs: (0.97 + 0.95 + 0.99 + 0.91 + 0.93 + 0.92) / 6 = 5.67 / 6
    assert (every.rm_corr.mean, every.rm_corr.low, every.rm_corr.high) == pytest.approx(
        (0.945, 0.91, 0.99)
    )
    assert hi.axis("rm_corr") == every.rm_corr
    # `lo`: one RM is constant (NaN correlation): left out of the mean, counted apart
    lo = fidelity["lo"]
    assert lo.rows[0].rm_corr.n == 2 and lo.rows[0].rm_corr.mean == pytest.approx(0.45)
    assert lo.axis("rm_corr").mean == pytest.approx((0.4 + 0.5 + 0.3 + 0.2 + 0.4) / 5)
    with pytest.raises(ValueError, match="axis: expected one of"):
        lo.axis("entropy")


def test_the_direction_models_table_by_hand() -> None:
    fidelity = setting_fidelity(results(), FAMILIES, model_seeds=True)
    text = fidelity_markdown(fidelity["hi"])
    assert (
        "| family | (policy, RM) pairs | RM correlation (Pearson) | RM pair accuracy "
        "| sampling entropy (nats) | entropy / log V | log V |"
    ) in text
    assert (
        "| llama | 3 | 0.970 (0.950 to 0.990) | 0.970 (0.960 to 0.980) "
        "| 3.840 (3.800 to 3.880) | 0.960 (0.950 to 0.970) | 4.000 |"
    ) in text
    assert (
        "| gpt2 | 3 | 0.920 (0.910 to 0.930) | 0.920 (0.900 to 0.940) "
        "| 2.200 (2.000 to 2.400) | 0.550 (0.500 to 0.600) | 4.000 |"
    ) in text
    assert "| all | 6 | 0.945 (0.910 to 0.990) | " in text
    lo = fidelity_markdown(fidelity["lo"])
    assert "| llama | 3 | 0.450 (0.400 to 0.500) (2 of 3) | 0.750 (0.700 to 0.800) " in lo
    assert "| 3.800 | 0.950 | 4.000 |" in lo  # every pair the same: the value alone


def test_without_model_seeds_one_pair_per_family_and_differing_records_are_refused() -> None:
    shared = {
        RunKey("hi", "llama", strategy, seed): {"info": {"policy_samples": fit("hi", "llama", 0)}}
        for strategy in ("uniform", "datc")
        for seed in SEEDS
    }
    (row,) = setting_fidelity(shared, FAMILIES, model_seeds=False)["hi"].rows
    assert row.family == "llama" and row.pairs == 1 and row.rm_corr.mean == pytest.approx(0.97)
    # a NaN figure (a constant RM) is the same record in every run of its pair
    nan = {
        RunKey("lo", "llama", strategy, 2): {
            "info": {"policy_samples": {**fit("lo", "llama", 2), "rm_corr": float("nan")}}
        }
        for strategy in ("uniform", "datc")
    }
    (row,) = setting_fidelity(nan, FAMILIES, model_seeds=True)["lo"].rows
    assert row.pairs == 1 and row.rm_corr.n == 0
    # with model seeds each seed has its own pair; without, seeds 0 and 1 must agree
    differing = results()
    with pytest.raises(ValueError, match=r"hi/gpt2/datc/seed0 and hi/gpt2/datc/seed1 share"):
        setting_fidelity(differing, FAMILIES, model_seeds=False)


def test_runs_of_a_setting_without_the_record_are_counted() -> None:
    data = results()
    del data[RunKey("hi", "gpt2", "uniform", 2)]["info"]
    data[RunKey("hi", "gpt2", "datc", 2)] = {"info": {}}
    hi = setting_fidelity(data, FAMILIES, model_seeds=True)["hi"]
    assert hi.overall.pairs == 5 and hi.unrecorded == 1
    assert "1 (policy, RM) pairs of this setting ran without the record" in fidelity_markdown(hi)


# --- the report, through the runner's write_outputs -------------------------------------

STRATEGIES = ("uniform", "uniform_hi", "datc")
#: (setting, strategy) -> held-out reward at the last evaluation, per (family, seed) offset.
LAST = {
    ("hi", "uniform"): 0.30,
    ("hi", "uniform_hi"): 0.40,
    ("hi", "datc"): 0.50,
    ("lo", "uniform"): 0.30,
    ("lo", "uniform_hi"): 0.20,
    ("lo", "datc"): 0.25,
    ("old", "uniform"): 0.30,
    ("old", "uniform_hi"): 0.20,
    ("old", "datc"): 0.35,
}


def _config(tmp_path: Path, sweeps: list[dict[str, Any]]) -> AblateConfig:
    length = {"kind": "length_sweep", "primary": "eval_reward_sampled"}
    return AblateConfig.model_validate(
        {
            "output_dir": str(tmp_path / "out"),
            "families": list(FAMILIES),
            "seeds": list(SEEDS),
            "model_seeds": True,
            "strategies": [
                "uniform",
                {"label": "uniform_hi", "name": "uniform", "train": {"optim": {"lr": 1e-3}}},
                "datc",
            ],
            "method": "datc",
            "settings": {
                "hi": {**length, "params": {"response_len": 24}},
                "lo": {**length, "params": {"response_len": 24, "rm": {"label_threshold": 0.25}}},
                "old": {**length, "params": {"response_len": 24, "rm_proxy": 1.0}},
            },
            "report": {
                "primary_family": {
                    "against_baseline": ["datc"],
                    "baseline_best_of": ["uniform", "uniform_hi"],
                },
                "sweeps": sweeps,
            },
        }
    )


def _write_results(cfg: AblateConfig) -> None:
    data = results(STRATEGIES)
    for run in plan_runs(cfg):
        offset = 0.01 * run.seed + (0.002 if run.family == "gpt2" else 0.0)
        if run.strategy == "datc":
            offset += 0.003 * run.seed  # the differences vary over pairs
        last = LAST[(run.setting, run.strategy)] + offset
        history = [
            {"step": s, "reward/mean": v, "eval/reward_sampled": v}
            for s, v in ((0, 0.1), (10, last))
        ]
        result = {"fingerprint": run_fingerprint(cfg, run), "history": history, "wall_s": 1.0}
        write_result(_folder(run, cfg), {**result, **data[run]})


def _folder(run: RunKey, cfg: AblateConfig) -> Path:
    folder = run.folder(cfg.output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def test_the_report_has_each_settings_direction_models_and_the_measured_sweep(
    tmp_path: Path,
) -> None:
    sweep = {"name": "fidelity", "settings": ["hi", "lo"], "axis": "rm_corr"}
    cfg = _config(tmp_path, [sweep])
    _write_results(cfg)
    outputs = write_outputs(cfg, command="test")
    report = outputs.report.read_text()
    fidelity = setting_fidelity(results(STRATEGIES), FAMILIES, model_seeds=True)
    for name in ("hi", "lo"):
        assert fidelity_markdown(fidelity[name]) in report
    old = report[report.rindex("## 9. length sweep") :]  # the settings in config order
    assert "Direction models" not in old  # older runs: the setting reads as before
    assert report.count("**Direction models on the step-0 policy's own samples**") == 2
    # the sweep: ordered by the measured correlation (lo 0.360, hi 0.945), against GRPO's
    # row picked per setting (hi: uniform_hi 0.40 > 0.30; lo: uniform 0.30 > 0.20)
    assert "### `fidelity`: `length_sweep` against measured `rm_corr`" in report
    assert (
        "| strategy | rm_corr = 0.360 (0.200 to 0.500) (`lo`) "
        "| rm_corr = 0.945 (0.910 to 0.990) (`hi`) |"
    ) in report
    # datc - GRPO's row: lo 0.25 - 0.30 = -0.05, hi 0.50 - 0.40 = +0.10, each plus 0.003 seed
    # (mean over seeds 0, 1, 2: +0.003)
    assert "| `datc` - GRPO | -0.047 [" in report and "| +0.103 [" in report
    assert "| GRPO (mean; its row at each point) | 0.311 (`uniform`) | 0.411 (`uniform_hi`) |" in (
        report
    )
    assert is_png(outputs.report.parent / "figures" / "sweep_fidelity.png")


def test_a_declared_sweep_over_settings_that_measured_nothing_is_refused_naming_it(
    tmp_path: Path,
) -> None:
    cfg = _config(tmp_path, [{"name": "fidelity", "settings": ["hi", "old"], "axis": "rm_corr"}])
    _write_results(cfg)
    with pytest.raises(
        ConfigError, match=r"report\.sweeps\.0: sweep 'fidelity': settings \['old'\]"
    ):
        write_outputs(cfg, command="test")
