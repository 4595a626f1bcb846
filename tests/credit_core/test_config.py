"""CreditConfig: the short and mapping forms, and errors naming the field."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest
import yaml

from credit_core import (
    CreditConfig,
    CreditError,
    get_strategy,
)

pytestmark = pytest.mark.usefixtures("single_torch_thread")


def test_config_short_and_mapping_forms() -> None:
    short = CreditConfig.parse("datc")
    assert short.name == "datc" and short.params == {}
    full = CreditConfig.parse({"name": "datc", "beta": 2.0, "lam": 0.3})
    assert full.name == "datc" and full.params == {"beta": 2.0, "lam": 0.3}
    assert CreditConfig.parse(full) is full
    assert CreditConfig().name == "uniform"
    strategy = get_strategy(full)
    assert strategy.name == "datc" and (strategy.params.beta, strategy.params.lam) == (2.0, 0.3)
    overridden = get_strategy(full, lam=0.9)
    assert (overridden.params.beta, overridden.params.lam) == (2.0, 0.9)
    from_dict = get_strategy({"name": "saliency", "beta": 3.0})
    assert from_dict.name == "saliency" and from_dict.params.beta == 3.0


def test_config_inside_a_yaml_run_config() -> None:
    class Run(pydantic.BaseModel):
        credit: CreditConfig = CreditConfig()

    assert Run.model_validate(yaml.safe_load("credit: datc")).credit.name == "datc"
    run = Run.model_validate(yaml.safe_load("credit: {name: datc_shuffled, seed: 4}"))
    assert get_strategy(run.credit).params.seed == 4
    assert Run().credit.name == "uniform"
    with pytest.raises(pydantic.ValidationError, match=r"parameter 'lam'"):
        Run.model_validate(yaml.safe_load("credit: {name: datc, lam: 2}"))


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("nope", r"unknown credit strategy 'nope'; registered strategies: \[.*'datc'.*\]"),
        ({"name": "nope", "beta": 1.0}, r"unknown credit strategy 'nope'"),
        ({"beta": 2.0}, r"strategy 'uniform': unknown parameter 'beta'"),
        ({"name": 3}, r"(?s)credit config: .*name.*Input should be a valid string"),
        ([1, 2], r"credit config: "),
        ({"name": "datc", "lam": 7}, r"strategy 'datc': parameter 'lam'"),
    ],
)
def test_invalid_configs(value: Any, message: str) -> None:
    with pytest.raises(CreditError, match=message):
        CreditConfig.parse(value)


def test_the_constructor_raises_credit_error_naming_the_parameter() -> None:
    with pytest.raises(
        CreditError, match=r"strategy 'datc': parameter 'beta': Input should be greater than 0"
    ) as info:
        CreditConfig(name="datc", beta=-1)
    assert not isinstance(info.value, pydantic.ValidationError)
    with pytest.raises(CreditError, match=r"credit config: name: Input should be a valid string"):
        CreditConfig(name=3)  # type: ignore[arg-type]
    with pytest.raises(CreditError, match=r"unknown credit strategy 'nope'"):
        CreditConfig(name="nope")


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"beta": True}, r"parameter 'beta': Input should be a valid number \(got True\)"),
        ({"beta": "2"}, r"parameter 'beta': Input should be a valid number \(got '2'\)"),
        ({"lam": False}, r"parameter 'lam': Input should be a valid number \(got False\)"),
        ({"seed": True}, r"parameter 'seed': Input should be a valid integer \(got True\)"),
        ({"seed": 1.0}, r"parameter 'seed': Input should be a valid integer \(got 1.0\)"),
    ],
)
def test_strategy_parameters_are_strict(params: dict[str, Any], message: str) -> None:
    """No bool or string stands for a number: ``beta: "2"`` is a mistake, not a 2.0."""
    with pytest.raises(CreditError, match=message):
        CreditConfig(name="datc_shuffled", **params)
    with pytest.raises(CreditError, match=message):
        get_strategy("datc_shuffled", **params)


def test_an_int_is_a_valid_float_parameter() -> None:
    assert CreditConfig(name="datc", beta=2).params == {"beta": 2}
    beta = get_strategy("datc", beta=2, lam=1).params.beta
    assert beta == 2.0 and isinstance(beta, float)


def test_config_is_immutable() -> None:
    config = CreditConfig.parse("datc")
    with pytest.raises(pydantic.ValidationError):
        config.name = "uniform"  # type: ignore[misc]


# ------------------------------------------------------------------- the agreement gate


def test_a_gate_is_a_credit_setting_apart_from_the_strategy_s_parameters() -> None:
    """docs/design.md, "Trusting the direction model": off when absent (and absent from the
    dump, so configs without it are unchanged), never passed to the strategy's Params."""
    plain = CreditConfig.parse({"name": "datc", "beta": 2.0})
    assert plain.gate is None and plain.model_dump(mode="json") == {"name": "datc", "beta": 2.0}
    gated = CreditConfig.parse({"name": "datc", "beta": 2.0, "gate": {"agreement": [0.1, 0.5]}})
    assert gated.params == {"beta": 2.0}
    assert gated.gate is not None and (gated.gate.agreement, gated.gate.decay) == ((0.1, 0.5), 0.9)
    assert get_strategy(gated).params == get_strategy(plain).params
    dumped = gated.model_dump(mode="json")
    assert dumped["gate"] == {"agreement": [0.1, 0.5], "decay": 0.9}
    assert CreditConfig.parse(yaml.safe_load(yaml.safe_dump(dumped))) == gated
    assert gated.label != plain.label  # a gated run is named apart from an ungated one


@pytest.mark.parametrize("name", ["datc", "datc_mid", "p2t", "red", "abc"])
def test_strategies_that_read_a_direction_model_take_a_gate(name: str) -> None:
    assert CreditConfig.parse({"name": name, "gate": {"agreement": [0.0, 0.5]}}).gate is not None


@pytest.mark.parametrize(
    ("credit", "message"),
    [
        (
            {"name": "uniform", "gate": {"agreement": [0.0, 0.5]}},
            "credit.gate: strategy 'uniform' reads no direction model",
        ),
        (
            {"name": "entropy_top", "gate": {"agreement": [0.0, 0.5]}},
            "credit.gate: strategy 'entropy_top' reads no direction model (it reads "
            "['token_entropy']",
        ),
        (
            {"name": "p2t", "mode": "paper", "gate": {"agreement": [0.0, 0.5]}},
            "credit.gate: strategy 'p2t' with mode 'paper' gives token rewards, not "
            "mean-preserving weights",
        ),
        (
            {"name": "datc", "gate": {"agreement": [0.5, 0.5]}},
            "gate.agreement: expected -1 <= low < high <= 1, got [0.5, 0.5]",
        ),
        ({"name": "datc", "gate": {"agreement": [0.0, 0.5], "decay": 1.0}}, "gate.decay"),
        ({"name": "datc", "gate": {"agreement": [0.0, 0.5], "low": 0}}, "gate.low: unknown key"),
    ],
)
def test_a_gate_it_cannot_take_is_refused_naming_the_key(
    credit: dict[str, Any], message: str
) -> None:
    with pytest.raises(CreditError) as err:
        CreditConfig.parse(credit)
    assert message in str(err.value)
