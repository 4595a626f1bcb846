"""The backend contract, one place for all four backends (docs/backends.md, "The contract").

Every backend (native ``backends.torch``, TRL, OpenRLHF, verl):

1. declares what it provides (``BACKEND``, a ``credit_core.plan.Backend``) and, at start-up,
   refuses every built-in strategy whose plan needs a signal or feature it lacks, with the
   plan's one message, and serves every other (checked here, in-process);
2. computes only the signals its plan reads (the plan's signals, checked here for every
   served strategy, and at run time by the backend's own tests named in ``RUNTIME``);
3. with ``uniform`` gives the framework's own GRPO advantages bit for bit;
4. counts its policy forwards per step (none beyond the framework's own for the signals).

Clauses 2 (run time), 3 and 4 are the backend's own tests (``RUNTIME``: their node ids),
written once next to the backend's machinery and run once, in their own files, by the same
suite; this module lists them and fails when one is missing, renamed or skipped. A backend's
case skips where its framework is not installed: the verl case runs in ``.venv-verl`` only
(``make pytest-verl``), the others in ``.venv``.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from credit_core import CreditConfig, CreditError, get_strategy, list_strategies
from credit_core.plan import Backend, CreditPlan
from tests.helpers.paths import REPO


@dataclass(frozen=True)
class Case:
    """One backend: the framework its case needs, its declaration, its start-up with a
    strategy (returns the plan it built; raises its refusal), and its own runtime tests."""

    framework: str | None
    declaration: Callable[[], Backend]
    start_up: Callable[[str, Path], CreditPlan]
    runtime: dict[str, list[str]]


def _native_backend() -> Backend:
    from backends.torch.config import BACKEND

    return BACKEND


def _native_start(name: str, tmp: Path) -> CreditPlan:
    from backends.torch.credit import credit_plan

    return credit_plan(CreditConfig.parse(name))


def _trl_backend() -> Backend:
    from backends.trl.config import BACKEND

    return BACKEND


def _trl_start(name: str, tmp: Path) -> CreditPlan:
    from backends.trl.config import CreditGRPOConfig

    args = CreditGRPOConfig(
        output_dir=str(tmp), credit=name, use_cpu=True, bf16=False, report_to="none"
    )
    plan: CreditPlan = args.credit_plan
    return plan


def _openrlhf_backend() -> Backend:
    from backends.openrlhf.compat import BACKEND

    return BACKEND


def _openrlhf_start(name: str, tmp: Path) -> CreditPlan:
    from backends.openrlhf.compat import resolve_credit
    from backends.openrlhf.settings import OpenRLHFCreditConfig
    from tests.helpers.openrlhf import openrlhf_args

    flags = ["--algo.advantage.estimator", "group_norm", "--algo.kl.use_loss"]
    flags += ["--rollout.n_samples_per_prompt", "2"]  # GRPO's groups (read by ktae)
    if name == "process":  # its token rewards come from a reward function's extra_logs
        flags += ["--reward.remote_url", str(tmp / "reward_func.py")]
    args = openrlhf_args([*flags, "--reward.model_name_or_path", "/models/rm"])
    return resolve_credit(args, OpenRLHFCreditConfig(credit=CreditConfig.parse(name))).plan


def _verl_backend() -> Backend:
    from backends.verl.config import BACKEND

    return BACKEND


def _verl_start(name: str, tmp: Path) -> CreditPlan:
    from backends.verl.config import credit_settings

    direction = {"kind": "seq_classification", "path": "/models/rm"}
    algorithm = {"adv_estimator": "grpo", "credit": name, "direction": direction}
    return credit_settings({"algorithm": algorithm}).plan


UNIFORM = "uniform is the framework's own GRPO"
FORWARDS = "policy forwards per step are counted"
ONLY_READ = "only the signals read are computed"

CASES: dict[str, Case] = {
    "native": Case(
        None,
        _native_backend,
        _native_start,
        {
            UNIFORM: [
                "tests/backends/torch/test_train.py::"
                "test_uniform_feeds_broadcast_response_advantages_and_computes_no_signals"
            ],
            FORWARDS: [
                "tests/backends/torch/test_baselines.py::"
                "test_a_baseline_takes_as_many_policy_forwards_as_grpo_and_only_its_signals"
            ],
            ONLY_READ: [
                "tests/backends/torch/test_train.py::"
                "test_every_builtin_strategy_completes_three_steps_computing_only_what_it_needs"
                "[datc]"
            ],
        },
    ),
    "trl": Case(
        "trl",
        _trl_backend,
        _trl_start,
        {
            UNIFORM: ["tests/backends/trl/test_trainer.py::test_uniform_is_stock_trl_bit_for_bit"],
            FORWARDS: [
                "tests/backends/trl/test_trainer.py::"
                "test_policy_signals_take_no_extra_policy_forward"
            ],
            ONLY_READ: [
                "tests/backends/trl/test_trainer.py::"
                "test_a_path_strategy_takes_points_rm_passes_per_scoring_chunk_and_no_reward_forward"
            ],
        },
    ),
    "openrlhf": Case(
        "openrlhf",
        _openrlhf_backend,
        _openrlhf_start,
        {
            UNIFORM: [
                "tests/backends/openrlhf/test_experience_maker.py::"
                "test_uniform_leaves_openrlhf_advantages_bitwise_unchanged"
            ],
            FORWARDS: [
                "tests/backends/openrlhf/test_forward_capture.py::"
                "test_a_datc_step_runs_as_many_policy_forwards_as_stock_openrlhf"
            ],
            ONLY_READ: [
                "tests/backends/openrlhf/test_forward_capture.py::"
                "test_without_a_seen_forward_the_signals_cost_one_counted_extra_forward"
            ],
        },
    ),
    "verl": Case(
        "verl",
        _verl_backend,
        _verl_start,
        {
            UNIFORM: ["tests/backends/verl/test_credit.py::test_uniform_is_verl_grpo_bit_for_bit"],
            FORWARDS: [
                "tests/backends/verl/test_engine.py::"
                "test_forward_count_and_log_probs_equal_verl_own_engine"
            ],
            ONLY_READ: [
                "tests/backends/verl/test_trainer.py::"
                "test_old_log_prob_and_advantage_steps_through_transfer_queue"
            ],
        },
    ),
}


def case_of(name: str) -> Case:
    """``CASES[name]``; skips where the backend's framework is not installed."""
    case = CASES[name]
    if case.framework is not None and importlib.util.find_spec(case.framework) is None:
        env = ".venv-verl (make pytest-verl)" if case.framework == "verl" else ".venv"
        pytest.skip(f"the {name} case needs {case.framework}: it runs in {env}")
    if case.framework is None and importlib.util.find_spec("verl") is not None:
        pytest.skip(f"the {name} case runs in .venv (this is verl's environment)")
    return case


@pytest.mark.parametrize("backend", sorted(CASES))
def test_a_strategy_the_backend_cannot_serve_is_refused_at_start_up(
    backend: str, tmp_path: Path
) -> None:
    case = case_of(backend)
    declared = case.declaration()
    for name in list_strategies():
        plan = CreditPlan.unchecked(get_strategy(name), declared)
        missing = plan.missing(declared)
        if missing:
            with pytest.raises(CreditError) as info:
                case.start_up(name, tmp_path)
            assert str(info.value) == plan.refusal(missing), name
        else:
            case.start_up(name, tmp_path)


@pytest.mark.parametrize("backend", sorted(CASES))
def test_the_backend_computes_only_the_signals_its_plan_reads(backend: str, tmp_path: Path) -> None:
    """At start-up, for every strategy it serves: the signals of the backend's own plan
    are the strategy's (``requires`` or, the reward gradient first, ``work_requires``),
    nothing more; at run time, ``RUNTIME[ONLY_READ]``."""
    case = case_of(backend)
    declared = case.declaration()
    for name in list_strategies():
        if CreditPlan.unchecked(get_strategy(name), declared).missing(declared):
            continue
        plan = case.start_up(name, tmp_path)
        cls = type(plan.strategy)
        assert plan.signals in (cls.requires, cls.work_requires), name
        assert plan.signals <= declared.signals, name
    _check_listed(case.runtime[ONLY_READ])


@pytest.mark.parametrize("backend", sorted(CASES))
def test_uniform_is_the_framework_s_own_grpo(backend: str) -> None:
    _check_listed(case_of(backend).runtime[UNIFORM])


@pytest.mark.parametrize("backend", sorted(CASES))
def test_the_policy_forwards_per_step_are_counted(backend: str) -> None:
    _check_listed(case_of(backend).runtime[FORWARDS])


def _check_listed(node_ids: list[str]) -> None:
    """Check that each of the backend's own tests ``node_ids`` (``path::name[params]``) is a
    test function defined in its file, parametrized where a parameter id is given, with no
    skip mark; read from the source (``ast``), so no framework is imported here. The suite
    runs each once, in its own file."""
    for node in node_ids:
        path, _, name = node.partition("::")
        base, _, param = name.partition("[")
        tree = ast.parse((REPO / path).read_text(), filename=path)
        found = [f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == base]
        assert base.startswith("test_") and len(found) == 1, f"{node}: no such test in {path}"
        marks = [ast.unparse(d) for d in found[0].decorator_list]
        assert not any(".skip" in m for m in marks), f"{node} is skipped: {marks}"
        if param:
            assert any("parametrize" in m for m in marks), f"{node}: not parametrized"


@pytest.mark.parametrize(
    ("node", "message"),
    [
        ("tests/backends/trl/test_trainer.py::test_no_such_thing", "no such test"),
        ("tests/backends/trl/test_trainer.py::test_uniform_is_stock_trl_bit_for_bit[x]", "not"),
    ],
)
def test_a_listed_test_that_is_missing_or_unparametrized_fails_the_contract(
    node: str, message: str
) -> None:
    with pytest.raises(AssertionError, match=message):
        _check_listed([node])
