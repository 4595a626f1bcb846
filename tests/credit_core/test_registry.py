"""The pluggy registry in-process: registering plugins and rejecting broken ones by name.

Every test that registers a plugin removes it again (fixture ``plugins``), so the registry
other tests see holds the built-ins (and installed entry points) only.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any, ClassVar

import pytest
import torch
from pydantic import BaseModel, Field

from credit_core import (
    CreditBatch,
    CreditError,
    CreditResult,
    CreditStrategy,
    ScoreParams,
    ScoreStrategy,
    get_strategy,
    hookimpl,
    list_strategies,
    plugin_of,
    register_plugin,
    unregister_plugin,
)
from credit_core.allocation import UNIFORM_DIAGNOSTICS


class FirstTokenParams(ScoreParams):
    boost: float = Field(1.0, gt=0.0, description="score of the first valid token")


class FirstToken(ScoreStrategy):
    """Scores the first valid token of each response ``boost``, the others 0."""

    name = "test_first_token"
    Params: ClassVar[type[BaseModel]] = FirstTokenParams
    params: FirstTokenParams

    def scores(self, batch: CreditBatch) -> torch.Tensor:
        first = batch.mask & (batch.mask.long().cumsum(dim=1) == 1)
        return first.float() * self.params.boost


class Halving(CreditStrategy):
    """A direct CreditStrategy: half the advantage on every valid token."""

    name = "test_halving"

    def assign_with_diagnostics(self, batch: CreditBatch) -> CreditResult:
        adv = torch.where(batch.mask, batch.advantages.float().unsqueeze(1) / 2, 0.0)
        return CreditResult(adv, UNIFORM_DIAGNOSTICS)


def plugin_module(name: str, hook: Callable[[], Any]) -> types.ModuleType:
    """A module named ``name`` whose credit_core_strategies hook is ``hook``."""
    module = types.ModuleType(name)
    module.credit_core_strategies = hookimpl(hook)  # type: ignore[attr-defined]
    return module


def providing(*classes: Any) -> Callable[[], Iterable[Any]]:
    def credit_core_strategies() -> Iterable[Any]:
        return list(classes)

    return credit_core_strategies


@pytest.fixture
def plugins() -> Iterator[list[str]]:
    """Names of plugins registered by the test; unregistered afterwards."""
    names: list[str] = []
    before = list_strategies()
    yield names
    for name in names:
        unregister_plugin(name)
    assert list_strategies() == before


def test_register_use_and_unregister_a_plugin(plugins: list[str]) -> None:
    module = plugin_module("tests_first_token_plugin", providing(FirstToken, Halving))
    plugins.append(register_plugin(module))
    assert plugins == ["tests_first_token_plugin"]
    assert {"test_first_token", "test_halving"} <= set(list_strategies())
    assert plugin_of("test_first_token") == "tests_first_token_plugin"
    assert plugin_of("datc") == "credit_core.builtin"

    mask = torch.tensor([[False, True, True, True], [True, True, False, False]])
    batch = CreditBatch(torch.tensor([2.0, -1.0]), mask, torch.zeros(2, 4, dtype=torch.long))
    strategy = get_strategy({"name": "test_first_token", "boost": 3.0, "lam": 1.0})
    adv = strategy.assign(batch)
    # Row 0: scores (3, 0, 0) over 3 tokens, rms sqrt(3): s_hat = (sqrt 3, 0, 0).
    e = torch.exp(torch.tensor(3.0).sqrt())
    w0 = 3 * torch.stack([e, torch.tensor(1.0), torch.tensor(1.0)]) / (e + 2)
    torch.testing.assert_close(adv[0, 1:], 2.0 * w0)
    assert get_strategy("test_halving").assign(batch).tolist() == [
        [0.0, 1.0, 1.0, 1.0],
        [-0.5, -0.5, 0.0, 0.0],
    ]
    with pytest.raises(CreditError, match=r"parameter 'boost': Input should be greater than 0"):
        get_strategy("test_first_token", boost=0)

    unregister_plugin(plugins.pop())
    assert "test_first_token" not in list_strategies()
    with pytest.raises(CreditError, match=r"unknown credit strategy 'test_first_token'"):
        get_strategy("test_first_token")


def test_an_object_with_a_hook_method_is_a_plugin(plugins: list[str]) -> None:
    class Provider:
        @hookimpl
        def credit_core_strategies(self) -> Iterable[type[CreditStrategy]]:
            return (Halving,)

    plugins.append(register_plugin(Provider(), name="tests-object-plugin"))
    assert plugin_of("test_halving") == "tests-object-plugin"


# ---------------------------------------------------------------- rejected plugins


def _assert_rejected(plugin: object, plugin_name: str, message: str) -> None:
    before = list_strategies()
    with pytest.raises(CreditError, match=message) as info:
        register_plugin(plugin, name=plugin_name)
    assert repr(plugin_name) in str(info.value), "the message names the plugin"
    assert list_strategies() == before, "a rejected plugin leaves the registry unchanged"


def test_duplicate_of_a_builtin_name() -> None:
    class Impostor(Halving):
        name = "datc"

    _assert_rejected(
        plugin_module("impostor", providing(Impostor)),
        "tests-impostor",
        r"strategy name 'datc' is already registered by plugin 'credit_core.builtin'",
    )
    assert get_strategy("datc").name == "datc" and plugin_of("datc") == "credit_core.builtin"


def test_duplicate_across_plugins(plugins: list[str]) -> None:
    plugins.append(register_plugin(plugin_module("a", providing(Halving)), name="tests-a"))
    _assert_rejected(
        plugin_module("b", providing(Halving)),
        "tests-b",
        r"'test_halving' is already registered by plugin 'tests-a'",
    )


def test_duplicate_within_one_plugin() -> None:
    _assert_rejected(
        plugin_module("twice", providing(Halving, Halving)),
        "tests-twice",
        r"strategy name 'test_halving' returned twice",
    )


def test_duplicate_plugin_name(plugins: list[str]) -> None:
    plugins.append(register_plugin(plugin_module("x", providing(Halving)), name="tests-x"))
    _assert_rejected(plugin_module("y", providing(FirstToken)), "tests-x", r"is already registered")
    with pytest.raises(CreditError, match=r"plugin 'credit_core.builtin' is already registered"):
        register_plugin(plugin_module("z", providing(FirstToken)), name="credit_core.builtin")


def test_plugin_without_a_hook() -> None:
    _assert_rejected(
        types.ModuleType("empty"), "tests-empty", r"no @hookimpl 'credit_core_strategies' found"
    )


def test_hook_that_raises() -> None:
    def credit_core_strategies() -> Iterable[Any]:
        raise RuntimeError("model weights missing")

    _assert_rejected(
        plugin_module("raises", credit_core_strategies),
        "tests-raises",
        r"credit_core_strategies\(\) raised RuntimeError: model weights missing",
    )


def test_hook_returning_a_non_iterable() -> None:
    def credit_core_strategies() -> Any:
        return Halving  # a class, not a list of classes

    _assert_rejected(
        plugin_module("bare", credit_core_strategies),
        "tests-bare",
        r"must return an iterable of strategy classes",
    )


def test_hook_with_a_wrong_signature() -> None:
    def credit_core_strategies(config: object) -> Iterable[Any]:
        return []

    _assert_rejected(
        plugin_module("signature", credit_core_strategies),
        "tests-signature",
        r"cannot be registered",
    )


class NotAStrategy:
    name = "test_not_a_strategy"


class Nameless(CreditStrategy):  # CreditStrategy only annotates ``name``
    def assign_with_diagnostics(self, batch: CreditBatch) -> CreditResult:
        raise NotImplementedError


class UpperName(Halving):
    name = "Bad Name"


class SetRequires(Halving):
    name = "test_set_requires"
    requires: ClassVar = {"reward_grad"}  # a set, not a frozenset


class UnknownSignal(Halving):
    name = "test_unknown_signal"
    requires = frozenset({"reward_grad", "logits"})


class DictParams(Halving):
    name = "test_dict_params"
    Params: ClassVar = {"beta": 1.0}  # a dict, not a pydantic model


class Abstract(ScoreStrategy):
    name = "test_abstract"  # no scores()


@pytest.mark.parametrize(
    ("cls", "message"),
    [
        (NotAStrategy, r"is not a subclass of credit_core.CreditStrategy"),
        ("datc", r"is not a subclass of credit_core.CreditStrategy"),
        (Nameless, r"class attribute 'name' must be a lowercase identifier string.*got None"),
        (UpperName, r"class attribute 'name' must be .*got 'Bad Name'"),
        (
            SetRequires,
            r"class attribute 'requires' must be a frozenset "
            r"within \['answer_saliency', 'policy_stats', 'prefix_rewards', 'reward_attention', "
            r"'reward_grad', "
            r"'token_entropy', 'unsigned_work'\]",
        ),
        (UnknownSignal, r"class attribute 'requires' must be a frozenset .*'logits'"),
        (DictParams, r"class attribute 'Params' must be a pydantic BaseModel class"),
        (Abstract, r"abstract methods not implemented: \['scores'\]"),
    ],
)
def test_classes_breaking_the_contract(cls: object, message: str) -> None:
    _assert_rejected(plugin_module("broken", providing(cls)), "tests-broken", message)


def test_a_rejected_class_rejects_its_whole_plugin() -> None:
    _assert_rejected(
        plugin_module("half", providing(FirstToken, Abstract)), "tests-half", r"abstract"
    )
    assert "test_first_token" not in list_strategies()


def test_unregister_errors() -> None:
    with pytest.raises(CreditError, match=r"plugin 'credit_core.builtin': not a registered third"):
        unregister_plugin("credit_core.builtin")
    with pytest.raises(CreditError, match=r"plugin 'tests-never': not a registered third-party"):
        unregister_plugin("tests-never")
