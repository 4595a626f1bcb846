"""Every bad input to credit_core is a CreditError naming the field and what was expected."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pydantic
import pytest
import torch
import yaml

from credit_core import (
    CreditBatch,
    CreditConfig,
    CreditError,
    PolicyStats,
    allocate_weights,
    get_strategy,
    list_strategies,
    policy_stats,
    policy_stats_from_logits,
)

pytestmark = pytest.mark.usefixtures("single_torch_thread")

B, T, D = 2, 3, 4
BUILTINS = (
    "uniform",
    "datc",
    "datc_unsigned",
    "datc_nosign",
    "datc_shuffled",
    "datc_inverse",
    "saliency",
)


def _stats(b: int = B, t: int = T, d: int = D) -> PolicyStats:
    return PolicyStats(
        p_sampled=torch.rand(b, t),
        p_sq=torch.rand(b, t),
        m1=torch.randn(b, t, d),
        m2=torch.randn(b, t, d),
        sampled_emb=torch.randn(b, t, d),
    )


def _fields(**override: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "advantages": torch.tensor([1.0, -1.0]),
        "mask": torch.tensor([[True, True, False], [True, False, False]]),
        "token_ids": torch.zeros(B, T, dtype=torch.long),
        "reward_grad": torch.randn(B, T, D),
        "policy_stats": _stats(),
    }
    fields.update(override)
    return fields


def test_valid_batch_constructs() -> None:
    batch = CreditBatch(**_fields())
    assert batch.batch_size == B and batch.lengths.tolist() == [2, 1]


# ---------------------------------------------------------------- CreditBatch


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"advantages": [1.0, -1.0]}, r"CreditBatch.advantages: expected a torch.Tensor, got list"),
        (
            {"advantages": torch.ones(B, 1)},
            r"CreditBatch.advantages: expected shape \(\*\), got \(2, 1\)",
        ),
        (
            {"advantages": torch.tensor([1, -1])},
            r"CreditBatch.advantages: expected a floating-point tensor, got torch.int64",
        ),
        (
            {"advantages": torch.tensor([1.0, float("nan")])},
            r"CreditBatch.advantages: expected finite values, rows \[1\]",
        ),
        (
            {"advantages": torch.tensor([float("-inf"), 0.0])},
            r"CreditBatch.advantages: expected finite values, rows \[0\]",
        ),
        (
            {"mask": torch.ones(3, T, dtype=torch.bool)},
            r"CreditBatch.mask: expected shape \(2, \*\), got \(3, 3\)",
        ),
        (
            {"mask": torch.ones(B, T, dtype=torch.long)},
            r"CreditBatch.mask: expected dtype torch.bool, got torch.int64",
        ),
        (
            {"mask": torch.ones(B, T, dtype=torch.bool, device="meta")},
            r"CreditBatch.mask: expected device cpu, got meta",
        ),
        (
            {"mask": torch.tensor([[True, False, False], [False, False, False]])},
            r"CreditBatch.mask: .*at least one valid token.*rows \[1\] are empty",
        ),
        (
            {
                "mask": torch.zeros(B, 0, dtype=torch.bool),
                "token_ids": torch.zeros(B, 0, dtype=torch.long),
                "reward_grad": None,
                "policy_stats": None,
            },
            r"CreditBatch.mask: .*rows \[0, 1\] are empty",
        ),
        (
            {"token_ids": torch.zeros(B, T + 1, dtype=torch.long)},
            r"CreditBatch.token_ids: expected shape \(2, 3\), got \(2, 4\)",
        ),
        (
            {"token_ids": torch.zeros(B, T, dtype=torch.int32)},
            r"CreditBatch.token_ids: expected dtype torch.int64, got torch.int32",
        ),
        (
            {"token_ids": torch.zeros(B, T, dtype=torch.long, device="meta")},
            r"CreditBatch.token_ids: expected device cpu, got meta",
        ),
        (
            {"reward_grad": torch.randn(B, T)},
            r"CreditBatch.reward_grad: expected shape \(2, 3, \*\), got \(2, 3\)",
        ),
        (
            {"reward_grad": torch.randn(B, T + 1, D)},
            r"CreditBatch.reward_grad: expected shape \(2, 3, \*\), got \(2, 4, 4\)",
        ),
        (
            {"reward_grad": torch.zeros(B, T, D, dtype=torch.long)},
            r"CreditBatch.reward_grad: expected a floating-point tensor",
        ),
        (
            {"reward_grad": torch.randn(B, T, D, device="meta")},
            r"CreditBatch.reward_grad: expected device cpu, got meta",
        ),
        (
            {"policy_stats": {"m1": torch.zeros(1)}},
            r"CreditBatch.policy_stats: expected PolicyStats, got dict",
        ),
        (
            {"policy_stats": _stats(b=3)},
            r"CreditBatch.policy_stats.p_sampled: expected shape \(2, 3\), got \(3, 3\)",
        ),
        (
            {"policy_stats": _stats(t=1)},
            r"CreditBatch.policy_stats.p_sampled: expected shape \(2, 3\), got \(2, 1\)",
        ),
        (
            {"policy_stats": _stats(d=D + 1)},
            r"CreditBatch.policy_stats.m1: expected embedding width d=4 \(from reward_grad\), "
            r"got 5",
        ),
    ],
)
def test_credit_batch_rejects(override: dict[str, Any], message: str) -> None:
    with pytest.raises(CreditError, match=message):
        CreditBatch(**_fields(**override))


def test_credit_batch_rejects_an_empty_batch() -> None:
    with pytest.raises(CreditError, match=r"CreditBatch.advantages: .*at least one response"):
        CreditBatch(torch.zeros(0), torch.zeros(0, 3, dtype=torch.bool), torch.zeros(0, 3).long())


def test_credit_batch_rejects_advantages_on_another_device() -> None:
    with pytest.raises(CreditError, match=r"CreditBatch.mask: expected device meta, got cpu"):
        CreditBatch(**_fields(advantages=torch.zeros(B, device="meta")))


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        (
            "p_sampled",
            torch.rand(B),
            r"PolicyStats.p_sampled: expected shape \(\*, \*\), got \(2,\)",
        ),
        (
            "p_sampled",
            torch.ones(B, T, dtype=torch.long),
            r"PolicyStats.p_sampled: expected a floating-point",
        ),
        ("p_sq", torch.rand(B, T + 1), r"PolicyStats.p_sq: expected shape \(2, 3\), got \(2, 4\)"),
        ("m1", torch.randn(B, T), r"PolicyStats.m1: expected shape \(2, 3, \*\), got \(2, 3\)"),
        (
            "m2",
            torch.randn(B, T, D + 1),
            r"PolicyStats.m2: expected shape \(2, 3, 4\), got \(2, 3, 5\)",
        ),
        (
            "sampled_emb",
            torch.randn(B, T, D, device="meta"),
            r"PolicyStats.sampled_emb: expected device cpu, got meta",
        ),
    ],
)
def test_policy_stats_container_rejects(field: str, value: torch.Tensor, message: str) -> None:
    fields = {f: getattr(_stats(), f) for f in ("p_sampled", "p_sq", "m1", "m2", "sampled_emb")}
    fields[field] = value
    with pytest.raises(CreditError, match=message):
        PolicyStats(**fields)


def test_policy_stats_cat_of_nothing() -> None:
    with pytest.raises(CreditError, match=r"PolicyStats.cat: expected at least one"):
        PolicyStats.cat([])


# ---------------------------------------------------------------- policy_stats inputs

H, V = 6, 10


def _ps_args(**override: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "hidden": torch.randn(B, T, H),
        "lm_head_weight": torch.randn(V, H),
        "token_ids": torch.randint(0, V, (B, T)),
        "reward_embedding": torch.randn(V, D),
    }
    args.update(override)
    return args


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"hidden": torch.randn(B * T, H)}, r"hidden: expected shape \(\*, \*, \*\), got \(6, 6\)"),
        (
            {"hidden": torch.zeros(B, T, H, dtype=torch.long)},
            r"hidden: expected a floating-point tensor",
        ),
        (
            {"lm_head_weight": torch.randn(V, H + 1)},
            r"lm_head_weight: expected shape \(\*, 6\), got \(10, 7\)",
        ),
        (
            {"lm_head_weight": torch.randn(V, H, device="meta")},
            r"lm_head_weight: expected device cpu, got meta",
        ),
        ({"lm_head_bias": torch.randn(V + 1)}, r"lm_head_bias: expected shape \(10\), got \(11,\)"),
        (
            {"token_ids": torch.zeros(B, T + 1, dtype=torch.long)},
            r"token_ids: expected shape \(2, 3\), got \(2, 4\)",
        ),
        (
            {"token_ids": torch.zeros(B, T)},
            r"token_ids: expected an integer dtype, got torch.float32",
        ),
        (
            {"token_ids": torch.zeros(B, T, dtype=torch.bool)},
            r"token_ids: expected an integer dtype, got torch.bool",
        ),
        (
            {"token_ids": torch.full((B, T), V)},
            r"token_ids: expected values in \[0, 10\) \(the vocabulary\), got \[10, 10\]",
        ),
        (
            {"token_ids": torch.tensor([[0, -1, 2], [3, 4, 5]])},
            r"token_ids: expected values in \[0, 10\).*got \[-1, 5\]",
        ),
        (
            {"reward_embedding": torch.randn(V + 2, D)},
            r"reward_embedding: expected shape \(10, \*\), got \(12, 4\)",
        ),
        (
            {"reward_embedding": torch.zeros(V, D, dtype=torch.long)},
            r"reward_embedding: expected a floating-point",
        ),
        ({"temperature": 0.0}, r"temperature: expected a finite value > 0, got 0.0"),
        ({"temperature": -1.0}, r"temperature: expected a finite value > 0, got -1.0"),
        ({"temperature": float("nan")}, r"temperature: expected a finite value > 0, got nan"),
        ({"temperature": float("inf")}, r"temperature: expected a finite value > 0, got inf"),
        ({"chunk_size": 0}, r"chunk_size: expected an integer >= 1, got 0"),
        ({"chunk_size": 2.5}, r"chunk_size: expected an integer >= 1, got 2.5"),
        ({"tile_elements": 0}, r"tile_elements: expected an integer >= 1, got 0"),
    ],
)
def test_policy_stats_rejects(override: dict[str, Any], message: str) -> None:
    with pytest.raises(CreditError, match=message):
        policy_stats(**_ps_args(**override))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"logits": torch.randn(B, T)}, r"logits: expected shape \(\*, \*, \*\), got \(2, 3\)"),
        ({"logits": torch.zeros(B, T, V, dtype=torch.long)}, r"logits: expected a floating-point"),
        (
            {"token_ids": torch.zeros(B + 1, T, dtype=torch.long)},
            r"token_ids: expected shape \(2, 3\), got \(3, 3\)",
        ),
        ({"token_ids": torch.full((B, T), V + 3)}, r"token_ids: expected values in \[0, 10\)"),
        (
            {"reward_embedding": torch.randn(V - 1, D)},
            r"reward_embedding: expected shape \(10, \*\), got \(9, 4\)",
        ),
        ({"temperature": 0.0}, r"temperature: expected a finite value > 0"),
        ({"chunk_size": -3}, r"chunk_size: expected an integer >= 1, got -3"),
        ({"tile_elements": -1}, r"tile_elements: expected an integer >= 1, got -1"),
    ],
)
def test_policy_stats_from_logits_rejects(override: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {
        "logits": torch.randn(B, T, V),
        "token_ids": torch.randint(0, V, (B, T)),
        "reward_embedding": torch.randn(V, D),
    }
    args.update(override)
    with pytest.raises(CreditError, match=message):
        policy_stats_from_logits(**args)


# ---------------------------------------------------------------- allocate_weights inputs


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"scores": torch.randn(1, T)}, r"mask: expected shape \(1, 3\), got \(2, 3\)"),
        ({"scores": torch.randn(B * T)}, r"scores: expected shape \(\*, \*\), got \(6,\)"),
        ({"mask": torch.ones(B, T)}, r"mask: expected dtype torch.bool, got torch.float32"),
        ({"mask": torch.zeros(B, T, dtype=torch.bool)}, r"mask: expected at least one valid token"),
        ({"beta": 0.0}, r"beta: expected a finite value > 0, got 0.0"),
        ({"beta": float("inf")}, r"beta: expected a finite value > 0, got inf"),
        ({"lam": 1.5}, r"lam: expected a value in \[0, 1\], got 1.5"),
        ({"lam": float("nan")}, r"lam: expected a value in \[0, 1\], got nan"),
        (
            {"on_nonfinite": "skip"},
            r"on_nonfinite: expected one of \['error', 'uniform'\], got 'skip'",
        ),
    ],
)
def test_allocate_weights_rejects(override: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {
        "scores": torch.randn(B, T),
        "mask": torch.ones(B, T, dtype=torch.bool),
        "beta": 1.0,
        "lam": 0.5,
        "on_nonfinite": "error",
    }
    args.update(override)
    with pytest.raises(CreditError, match=message):
        allocate_weights(**args)


# ---------------------------------------------------------------- get_strategy


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


# ---------------------------------------------------------------- CreditConfig


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


def test_replace_keeps_validation() -> None:
    """dataclasses.replace re-runs CreditBatch's checks (what the strategy tests rely on)."""
    batch = CreditBatch(**_fields())
    with pytest.raises(CreditError, match=r"CreditBatch.reward_grad"):
        replace(batch, reward_grad=torch.randn(B, T))
