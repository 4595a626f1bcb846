"""``CreditPlan``: the signals a backend computes for a strategy, where each comes from, and
the one refusal of a strategy the backend cannot serve (credit_core/plan.py;
docs/backends.md, "The plan")."""

from __future__ import annotations

import pytest

from credit_core import SIGNALS, CreditConfig, CreditError, get_strategy, list_strategies
from credit_core.batch import DIRECTION_SIGNALS, TRAINED_MODEL_SIGNALS
from credit_core.plan import (
    FEATURES,
    SOURCES,
    Backend,
    CreditPlan,
    sampling_problem,
    signals_read,
)

HINT = "use another backend"
EVERYTHING = Backend("all", "credit", SIGNALS, FEATURES, hint=HINT)
NO_PATH_WORK = Backend("all", "credit", SIGNALS, FEATURES, path_work=False, hint=HINT)
SCORE_LATE = Backend("late", "credit", SIGNALS, FEATURES, work_first=False, hint=HINT)


def test_every_signal_has_one_source_and_the_trained_model_ones_are_trained() -> None:
    assert set(SOURCES) == SIGNALS
    assert {s for s, src in SOURCES.items() if src == "trained_model"} == TRAINED_MODEL_SIGNALS


def test_the_strategy_is_built_once_and_reused() -> None:
    strategy = get_strategy("datc")
    assert CreditPlan.build(strategy, EVERYTHING).strategy is strategy
    plan = CreditPlan.build(CreditConfig(name="datc", beta=2.0), EVERYTHING)
    assert plan.strategy.params.beta == 2.0  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", sorted(list_strategies()))
def test_the_signals_follow_the_reward_gradient_first_rule(name: str) -> None:
    """W0 instead of the statistics where the gradient comes first (the native trainer's
    rule, docs/design.md "DATC"); a path strategy gets W0 only where the policy pass forms
    it (``path_work``); a backend scoring after the policy pass never gets W0."""
    cls = type(get_strategy(name))
    plan = CreditPlan.build(name, NO_PATH_WORK)
    first = not plan.path
    assert plan.signals == cls.signals_to_compute(reward_grad_first=first)
    assert plan.reward_grad_first is first
    late = CreditPlan.build(name, SCORE_LATE)
    assert late.signals == cls.requires and not late.reward_grad_first
    path_work = Backend("pw", "credit", SIGNALS, FEATURES, path_work=True, hint=HINT)
    assert CreditPlan.build(name, path_work).signals == cls.signals_to_compute(
        reward_grad_first=True
    )


def test_datc_streams_w0_and_a_path_strategy_reads_the_statistics() -> None:
    datc = CreditPlan.build("datc", NO_PATH_WORK)
    assert datc.signals == {"unsigned_work"} and datc.sources == {"unsigned_work": "policy_pass"}
    assert datc.needs_direction and datc.needs_reward_grad and datc.reads_sampled_distribution
    mid = CreditPlan.build("datc_mid", NO_PATH_WORK)
    assert mid.signals == {"reward_grad", "policy_stats"} and mid.path
    assert mid.from_source("direction") == {"reward_grad"}
    assert "path_gradient" in mid.features


def test_uniform_reads_nothing_and_fits_every_backend() -> None:
    nothing = Backend("bare", "credit", frozenset(), frozenset(), hint=HINT)
    plan = CreditPlan.build("uniform", nothing)
    assert plan.signals == frozenset() and plan.features == frozenset()
    assert not plan.needs_direction and plan.trained_model is None


def test_the_features_a_strategy_reads() -> None:
    assert CreditPlan.build("prime", EVERYTHING).trained_model is not None
    assert "trained_model" in CreditPlan.build("prime", EVERYTHING).features
    assert CreditPlan.build("oar_g", EVERYTHING).features == {"answer_span"}
    assert CreditPlan.build("ktae", EVERYTHING).features == {"groups"}
    assert CreditPlan.build("entropy_top", EVERYTHING).gathers


def test_a_backend_lacking_a_signal_or_feature_refuses_with_one_message() -> None:
    backend = Backend(
        "Toy",
        "algorithm.credit",
        frozenset({"unsigned_work"}),
        frozenset({"gather"}),
        hint=HINT,
    )
    with pytest.raises(CreditError) as err:
        CreditPlan.build("abc", backend)
    text = str(err.value)
    assert text.startswith("algorithm.credit: strategy 'abc' is not served: it reads ")
    assert "['reward_attention']" in text and "which the Toy backend does not provide" in text
    assert text.endswith(HINT)
    with pytest.raises(CreditError, match=r"it reads each response's answer span"):
        CreditPlan.build("oar_g", Backend("Toy", "credit", SIGNALS, frozenset(), hint=HINT))
    with pytest.raises(CreditError, match=r"it reads \['implicit_log_ratio'\] and the log-probs"):
        CreditPlan.build(
            "prime",
            Backend(
                "Toy",
                "credit",
                SIGNALS - TRAINED_MODEL_SIGNALS,
                FEATURES - {"trained_model"},
                hint=HINT,
            ),
        )


def test_a_backend_declares_known_signals_and_features_only() -> None:
    with pytest.raises(CreditError, match="signals must be within"):
        Backend("x", "credit", frozenset({"logits"}), frozenset(), hint=HINT)
    with pytest.raises(CreditError, match="features must be within"):
        Backend("x", "credit", frozenset(), frozenset({"packing"}), hint=HINT)


def test_the_refusal_s_hint_is_the_backend_s_own() -> None:
    """The core names no backend: a ``Backend`` says itself what serves what it refuses."""
    with pytest.raises(TypeError, match="hint"):
        Backend("x", "credit", frozenset(), frozenset())  # type: ignore[call-arg]


def test_truncated_sampling_is_named_by_the_backend_s_key() -> None:
    off = {"top_k": (0, None), "top_p": (1.0, None)}
    plan = CreditPlan.build("datc", EVERYTHING)
    problem = plan.sampling_problem({"gen.top_k": 50, "gen.top_p": 1.0}, off)
    assert problem is not None and problem.key == "gen.top_k"
    assert str(problem).startswith("gen.top_k: 50 truncates the sampling distribution")
    assert plan.sampling_problem({"gen.top_k": None, "gen.top_p": 1.0}, off) is None
    saliency = CreditPlan.build("saliency", EVERYTHING)
    assert saliency.sampling_problem({"gen.top_k": 50}, off) is None
    reads = signals_read(type(get_strategy("datc_mid")))
    assert sampling_problem("datc_mid", reads, {"top_p": 0.9}, off) is not None


def test_a_response_level_estimator_is_required_except_for_uniform() -> None:
    plan = CreditPlan.build("datc", EVERYTHING)
    problem = plan.estimator_problem("algo.estimator", "gae", ["grpo"])
    assert problem is not None and "splits a response-level advantage" in str(problem)
    assert plan.estimator_problem("algo.estimator", "grpo", ["grpo"]) is None
    uniform = CreditPlan.build("uniform", EVERYTHING)
    assert uniform.estimator_problem("algo.estimator", "gae", ["grpo"]) is None


def test_a_critic_estimator_serves_the_strategies_with_a_token_reward_form() -> None:
    datc = CreditPlan.build("datc", EVERYTHING)
    assert datc.estimator_problem("algo.estimator", "gae", ["grpo"], critic=["gae"]) is None
    paper = CreditPlan.build({"name": "red", "mode": "paper"}, EVERYTHING)
    assert paper.estimator_problem("algo.estimator", "gae", ["grpo"], critic=["gae"]) is None
    ktae = CreditPlan.build("ktae", EVERYTHING)
    problem = ktae.estimator_problem("algo.estimator", "gae", ["grpo"], critic=["gae"])
    assert problem is not None and problem.key == "algo.estimator"
    assert "has no token-reward form for a critic" in str(problem)
    assert "rloo" in str(datc.estimator_problem("k", "rloo", ["grpo"], critic=["gae"]))


def test_the_direction_model_must_give_what_is_read() -> None:
    abc = CreditPlan.build("abc", EVERYTHING)
    problem = abc.direction_problem(
        "direction", "ModuleRM", gives_attention=False, path_problem=None
    )
    assert problem is not None and "(reward_attention), but ModuleRM gives none" in str(problem)
    assert abc.direction_problem("d", "M", gives_attention=True, path_problem="x") is None
    mid = CreditPlan.build("datc_mid", EVERYTHING)
    problem = mid.direction_problem("d", "M", gives_attention=True, path_problem="no ids")
    assert problem is not None and str(problem).startswith("d: strategy 'datc_mid'")
    assert set(DIRECTION_SIGNALS) <= SIGNALS
