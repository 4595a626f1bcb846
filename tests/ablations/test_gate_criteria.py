"""The gate's pre-registered criteria (``ablations.gate_criteria``): the floor on the weak
settings is the lower bound of gated - GRPO, the keep criterion the ratio of the gated to the
ungated gain, both over the pairs all of them ran; too few pairs or no gain: not judged."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
import yaml

from ablations.ablation_config import AblateConfig, GateCriteriaConfig, load_ablate_config
from ablations.gate_criteria import gate_criteria, gate_criteria_markdown
from ablations.results import RunKey, result_rows
from ablations.runner import summary_spec
from ablations.stats import mean_interval
from credit_core.errors import FieldError
from tests.helpers.paths import REPO

GATE = REPO / "configs" / "ablate" / "gate.yaml"


def _run(setting: str, strategy: str, family: str, seed: int, held_out: float) -> list[Any]:
    base = {"setting": setting, "family": family, "strategy": strategy, "seed": seed}
    return [
        {**base, "step": 0, "reward_mean": 0.0},
        {**base, "step": 1, "reward_mean": 0.0, "eval_reward_sampled": held_out},
    ]


def _rows(setting: str, values: dict[str, list[float]]) -> list[Any]:
    """One run per (strategy, pair): pair i is family llama/gpt2 by parity, seed i // 2."""
    rows = []
    for strategy, per_pair in values.items():
        for i, v in enumerate(per_pair):
            rows += _run(setting, strategy, ("llama", "gpt2")[i % 2], i // 2, v)
    return rows


def test_the_shipped_gate_config_names_the_criteria_of_its_comment() -> None:
    gate = load_ablate_config(GATE).report.gate_criteria
    assert gate == GateCriteriaConfig(
        gated="datc_gated",
        ungated="datc",
        weak=["outcome_chain"],
        floor=-0.03,
        good=["sweep_96", "proxy_05"],
        keep=0.8,
    )


def test_the_floor_is_the_lower_bound_of_gated_minus_grpo() -> None:
    cfg = load_ablate_config(GATE)
    spec = summary_spec(cfg)
    grpo = [0.3, 0.2, 0.4, 0.5, 0.1, 0.3]
    near = [0.29, 0.21, 0.39, 0.5, 0.1, 0.3]  # within a hundredth: lower bound above -0.03
    below = [0.1, 0.05, 0.2, 0.3, 0.1, 0.2]
    for gated, expected in ((near, True), (below, False)):
        rows = _rows("outcome_chain", {"uniform": grpo, "datc_gated": gated})
        (check,) = gate_criteria(rows, spec, cfg.report.gate_criteria).floor  # type: ignore[arg-type]
        want = mean_interval([g - b for g, b in zip(gated, grpo, strict=True)])
        assert check.diff == want
        assert check.met is expected
    # under the report's min_pairs: shown, not judged
    few = spec.min_pairs - 1
    rows = _rows("outcome_chain", {"uniform": grpo[:few], "datc_gated": near[:few]})
    (check,) = gate_criteria(rows, spec, cfg.report.gate_criteria).floor  # type: ignore[arg-type]
    assert check.diff.n == few and check.met is None


def test_keep_is_the_ratio_of_the_gated_to_the_ungated_gain_on_common_pairs() -> None:
    cfg = load_ablate_config(GATE)
    spec = summary_spec(cfg)
    grpo = [0.2, 0.3, 0.1, 0.4, 0.2, 0.3]
    ungated = [v + 0.2 for v in grpo]
    gated = [v + 0.17 for v in grpo] + [0.9]  # 85 % kept; a seventh pair only gated ran
    rows = _rows("sweep_96", {"uniform": grpo, "datc": ungated, "datc_gated": gated})
    result = gate_criteria(rows, spec, cfg.report.gate_criteria)  # type: ignore[arg-type]
    check = result.keep[0]
    assert (check.setting, check.gated.n) == ("sweep_96", 6)
    assert check.kept == pytest.approx(0.85)
    assert check.met is True
    assert check.shortfall.mean == pytest.approx(0.17 - 0.8 * 0.2)
    # proxy_05 has no runs: nothing judged, said so
    assert result.keep[1].gated.n == 0 and result.keep[1].met is None
    # a gain of 75 % misses it; an ungated loss leaves no gain to keep
    for gated_now, ungated_now, met in (
        ([v - 0.05 for v in ungated], ungated, False),
        (grpo, [v - 0.1 for v in grpo], None),
    ):
        rows = _rows("sweep_96", {"uniform": grpo, "datc": ungated_now, "datc_gated": gated_now})
        check = gate_criteria(rows, spec, cfg.report.gate_criteria).keep[0]  # type: ignore[arg-type]
        assert check.met is met
    assert math.isnan(check.kept)


def test_the_section_gives_every_check_and_its_verdict() -> None:
    cfg = load_ablate_config(GATE)
    spec = summary_spec(cfg)
    same = [0.3, 0.2, 0.4, 0.5, 0.1, 0.3]
    rows = _rows("outcome_chain", {"uniform": same, "datc_gated": same})
    text = gate_criteria_markdown(
        gate_criteria(rows, spec, cfg.report.gate_criteria),  # type: ignore[arg-type]
        spec.confidence,
    )
    assert "## The gate's criteria (pre-registered)" in text
    assert "| floor -0.030 | outcome_chain | 6 | +0.000 [+0.000, +0.000] | | | | **met** |" in text
    assert "| keep 80% | sweep_96 | 0 | n/a | n/a | n/a (no gain) | n/a | not judged |" in text


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("gated", "nope", "report.gate_criteria.gated: 'nope' is not one of the strategies"),
        ("ungated", "datc_gated", "report.gate_criteria.ungated: expected another label"),
        ("weak", ["nowhere"], "report.gate_criteria.weak: ['nowhere'] are not settings"),
        ("keep", 1.5, "keep"),
        ("floor", 0.1, "floor"),
    ],
)
def test_a_bad_criterion_is_named(key: str, value: Any, message: str) -> None:
    raw = yaml.safe_load(GATE.read_text())
    raw["report"]["gate_criteria"][key] = value
    with pytest.raises((FieldError, ValueError), match=re.escape(message)):
        AblateConfig.model_validate(raw)


def test_each_steps_agreement_and_gate_alpha_are_results_columns() -> None:
    history = [{"step": 0, "credit/direction_agreement": 0.4, "credit/gate_alpha": 0.5}]
    result = {"history": history, "code": "abc1234", "wall_s": 1.0, "peak_rss_mb": 2.0}
    (row,) = result_rows(RunKey("binary", "llama", "datc_gated", 0), result)
    assert (row["credit_direction_agreement"], row["credit_gate_alpha"]) == (0.4, 0.5)
