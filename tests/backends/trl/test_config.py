"""CreditGRPOConfig through TrlParser (YAML + command line) and the TRL version check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from trl import TrlParser

from backends.trl import CreditGRPOConfig
from backends.trl.version import SUPPORTED_SERIES, check_trl_version
from credit_core import CreditConfig, CreditError

CPU = ["--use_cpu", "true", "--bf16", "false", "--report_to", "none"]


def _parse(tmp_path: Path, yaml_text: str, *argv: str) -> Any:
    path = tmp_path / "config.yaml"
    path.write_text(f"output_dir: {tmp_path / 'out'}\n" + yaml_text)
    (args,) = TrlParser((CreditGRPOConfig,)).parse_args_and_config(
        ["--config", str(path), *CPU, *argv]
    )
    return args


def test_yaml_short_form(tmp_path: Path) -> None:
    args = _parse(tmp_path, "credit: datc\n")
    assert args.credit == CreditConfig(name="datc") and args.credit_config.name == "datc"


def test_the_gate_is_taken_and_refused_on_a_strategy_without_direction(tmp_path: Path) -> None:
    """``credit.gate`` (applied by ``TrlCredit``): taken for datc, refused naming the key
    for a strategy that reads no direction model."""
    args = _parse(tmp_path, "credit: {name: datc, gate: {agreement: [0.2, 0.6]}}\n")
    gate = args.credit_config.gate
    assert gate is not None and gate.agreement == (0.2, 0.6)
    with pytest.raises(
        CreditError, match=r"^credit: credit\.gate: strategy 'entropy_top' reads no"
    ):
        _parse(tmp_path, "credit: {name: entropy_top, gate: {agreement: [0.2, 0.6]}}\n")


def test_yaml_mapping_direction_and_command_line_override(tmp_path: Path) -> None:
    text = (
        "credit: {name: datc, beta: 2.0, lam: 0.25}\n"
        "direction: {kind: module, factory: 'pkg.mod:make'}\n"
        "credit_stats_chunk_size: 128\n"
    )
    args = _parse(tmp_path, text)
    assert args.credit_config.params == {"beta": 2.0, "lam": 0.25}
    assert args.direction_config.kind == "module" and args.credit_stats_chunk_size == 128
    assert args.to_dict()["credit"] == {"name": "datc", "beta": 2.0, "lam": 0.25}
    assert _parse(tmp_path, text, "--credit", "uniform").credit_config.name == "uniform"
    beta3 = _parse(tmp_path, text, "--credit", '{"name": "datc", "beta": 3}')
    assert beta3.credit_config.params == {"beta": 3}


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("credit: nope\n", r"^credit: unknown credit strategy 'nope'"),
        ("credit: {name: datc, beta: -1}\n", r"^credit: strategy 'datc': parameter 'beta'"),
        ("credit: {name: datc, bogus: 1}\n", r"^credit: .*unknown parameter 'bogus'"),
        ("direction: {kind: nope}\n", r"^direction.kind: unknown kind 'nope'"),
        ("direction: {kind: module}\n", r"^direction: factory: required for kind 'module'"),
        ("credit_stats_chunk_size: 0\n", r"^credit_stats_chunk_size: expected an integer >= 1"),
        ("credit: datc\ntop_k: 50\n", r"^top_k: 50 truncates the sampling distribution"),
        ("credit: datc\ntop_p: 0.9\n", r"^top_p: 0.9 truncates"),
        ("credit: datc\ngeneration_kwargs: {min_p: 0.1}\n", r"^generation_kwargs.min_p: 0.1"),
        (
            "credit: entropy_top\ntop_entropy_quantile: 0.2\n",
            r"^top_entropy_quantile: 0.2 applies TRL's own high-entropy mask on top of credit",
        ),
        ("credit: {name: entropy_top, mode: both}\n", r"^credit: strategy 'entropy_top'"),
    ],
)
def test_bad_values_name_the_key(tmp_path: Path, yaml_text: str, message: str) -> None:
    with pytest.raises(CreditError, match=message):
        _parse(tmp_path, yaml_text)


def test_prime_is_refused_when_the_config_is_parsed(tmp_path: Path) -> None:
    """docs/trl.md: PRIME's implicit PRM is a second model trained every step; TRL's trainer
    hosts one model inside the plugin contract, so the config refuses the strategy."""
    with pytest.raises(CreditError) as info:
        _parse(tmp_path, "credit: {name: prime, prm_lr: 0.001}\n")
    text = str(info.value)
    assert text.startswith(
        "credit: strategy 'prime' is not served: it reads ['implicit_log_ratio']"
    )
    assert "the log-probs of a second trainable model" in text
    assert "which the TRL backend does not provide" in text


def test_truncated_sampling_is_fine_for_strategies_without_stats(tmp_path: Path) -> None:
    assert _parse(tmp_path, "credit: saliency\ntop_k: 50\n").top_k == 50


def test_baseline_strategies_from_yaml(tmp_path: Path) -> None:
    args = _parse(tmp_path, "credit: {name: entropy_top, rho: 0.1, mode: weight}\n")
    assert args.to_dict()["credit"] == {"name": "entropy_top", "rho": 0.1, "mode": "weight"}
    assert _parse(tmp_path, "credit: datc\ntop_entropy_quantile: 0.2\n").top_entropy_quantile == 0.2
    for name in ("random_top", "abc", "red"):
        assert _parse(tmp_path, f"credit: {name}\n").credit_config.name == name


def test_other_trl_versions_are_refused() -> None:
    assert check_trl_version("1.16.0") == "1.16.0"
    major, minor = SUPPORTED_SERIES
    for other in (f"{major}.{minor + 1}.0", f"{major}.{minor - 1}.2", "0.29.0", "nonsense"):
        with pytest.raises(CreditError, match=r"supports TRL 1\.16\.x \(tested with 1\.16\.0\)"):
            check_trl_version(other)
    assert check_trl_version() == "1.16.0"  # the installed one (constraints.txt)


@pytest.mark.parametrize(
    ("yaml_text", "key"),
    [
        ("credit: oar_g\n", "credit"),
        ("credit: datc\ncredit_samples_compare: [uniform, oar_g]\n", "credit_samples_compare.1"),
    ],
)
def test_oar_g_is_refused_at_start_up_naming_its_signal_and_the_answer_span(
    tmp_path: Path, yaml_text: str, key: str
) -> None:
    """OAR-G reads the policy's own answer-distribution gradient and the task's answer span,
    which TRL's trainer computes neither of (docs/design.md, "Answer-gradient reweighting")."""
    with pytest.raises(CreditError) as info:
        _parse(tmp_path, yaml_text)
    text = str(info.value)
    assert text.startswith(
        f"{key}: strategy 'oar_g' is not served: it reads ['answer_saliency'] and each "
        "response's answer span (CreditBatch.answer_mask)"
    )
    assert "which the TRL backend does not provide" in text and "backends.torch" in text
