"""get_strategy: unknown names and bad parameters are CreditErrors naming them."""

from __future__ import annotations

from typing import Any

import pytest

from credit_core import (
    CreditConfig,
    CreditError,
    get_strategy,
    list_strategies,
)
from tests.credit_core.test_strategies import SCORE_BASED

pytestmark = pytest.mark.usefixtures("single_torch_thread")

BUILTINS = ("uniform", *SCORE_BASED)  # docs/design.md, "Strategies"


def test_unknown_strategy_lists_the_registered_names() -> None:
    with pytest.raises(CreditError, match=r"unknown credit strategy 'datcc'") as info:
        get_strategy("datcc")
    for name in BUILTINS:
        assert repr(name) in str(info.value)
    assert set(BUILTINS) <= set(list_strategies())


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        (
            "datc",
            {"betta": 1.0},
            r"strategy 'datc': unknown parameter 'betta'; "
            r"allowed parameters: \['beta', 'lam', 'on_nonfinite'\]",
        ),
        ("datc", {"seed": 1}, r"unknown parameter 'seed'"),
        (
            "uniform",
            {"beta": 1.0},
            r"strategy 'uniform': unknown parameter 'beta'; allowed parameters: \[\]",
        ),
        ("datc", {"beta": 0.0}, r"parameter 'beta': Input should be greater than 0 \(got 0.0\)"),
        (
            "saliency",
            {"beta": -2.0},
            r"parameter 'beta': Input should be greater than 0 \(got -2.0\)",
        ),
        ("datc", {"beta": float("inf")}, r"parameter 'beta': .*finite"),
        ("datc", {"beta": "big"}, r"parameter 'beta': Input should be a valid number"),
        (
            "datc",
            {"lam": 1.5},
            r"parameter 'lam': Input should be less than or equal to 1 \(got 1.5\)",
        ),
        (
            "datc_inverse",
            {"lam": -0.1},
            r"parameter 'lam': Input should be greater than or equal to 0",
        ),
        (
            "datc",
            {"on_nonfinite": "skip"},
            r"parameter 'on_nonfinite': Input should be 'error' or 'uniform' \(got 'skip'\)",
        ),
        (
            "datc_shuffled",
            {"seed": -1},
            r"strategy 'datc_shuffled': parameter 'seed': "
            r"Input should be greater than or equal to 0",
        ),
        (
            "datc_shuffled",
            {"sead": 1},
            r"allowed parameters: \['beta', 'lam', 'on_nonfinite', 'seed'\]",
        ),
    ],
)
def test_bad_parameters_name_the_field_and_range(
    name: str, params: dict[str, Any], message: str
) -> None:
    with pytest.raises(CreditError, match=message):
        get_strategy(name, **params)
    with pytest.raises(CreditError, match=message):
        CreditConfig.parse({"name": name, **params})


def test_get_strategy_rejects_other_specs() -> None:
    with pytest.raises(
        CreditError, match=r"get_strategy: expected a name, a dict or a CreditConfig, got int"
    ):
        get_strategy(3)  # type: ignore[arg-type]


def test_parameters_are_validated_and_kept() -> None:
    strategy = get_strategy("datc_shuffled", beta=2, lam=0.25, seed=9)
    assert strategy.params.model_dump() == {
        "beta": 2.0,
        "lam": 0.25,
        "on_nonfinite": "error",
        "seed": 9,
    }
    assert get_strategy("datc").params.model_dump() == {
        "beta": 1.0,
        "lam": 0.5,
        "on_nonfinite": "error",
    }
