"""The credit keys of verl's Hydra config, parsed and checked at start-up.

A verl run takes the strategy, its direction model and the tile size beside verl's own
algorithm keys::

    algorithm:
      adv_estimator: grpo
      credit: datc                          # or {name: datc, beta: 1.0}
      direction: {kind: seq_classification, path: /models/rm}
      credit_stats_chunk_size: 4096         # optional

``credit_settings(config)`` parses them into the shared ``CreditSection`` and builds the
process's one ``CreditRun`` on ``BACKEND`` (its plan and strategy, built once; the agreement
gate where ``algorithm.credit`` has a ``gate``), refusing with a ``CreditError`` naming the
key a bad value or a strategy this backend cannot serve: the backend ships
per-token scalars from verl's actor engine to the trainer (DATC's unsigned work W0, P2T's
attribution, the direction model's attention and prefix rewards, verl's own entropy), not
the reward model's gradient tensor. Under verl's critic estimator
(``algorithm.adv_estimator=gae``) a strategy with a token-reward form is served as a shift of
verl's token rewards (docs/design.md, "Credit under a critic"), which needs >= 2 samples per
prompt.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from backends.common.config_values import CreditSection, SectionKeys, parse_section
from backends.common.credit import CreditRun
from credit_core import CreditError
from credit_core.plan import Backend, CreditPlan

#: The signals verl's actor engine computes on request (``backends.verl.engine``, which
#: imports verl; this module does not), each with its model-output key and TransferQueue
#: field.
SIGNAL_FIELDS: dict[str, str] = {
    "unsigned_work": "credit_unsigned_work",
    "reward_attention": "credit_reward_attention",
    "prefix_rewards": "credit_prefix_rewards",
    "reward_attribution": "credit_reward_attribution",
}
ENGINE_SIGNALS: frozenset[str] = frozenset(SIGNAL_FIELDS)
#: The model-output key (and TransferQueue field) of the direction model's own score of each
#: response, which the engine ships beside a signal when the request asks for ``scores``
#: (the credit's agreement with verl's reward, docs/design.md "Trusting the direction
#: model"): in the signals' layout, the score at the position that predicts the response's
#: last token, 0 elsewhere.
SCORES_FIELD = "credit_direction_scores"

#: The ``trainer.v1.trainer_mode`` of ``CreditPPOTrainer`` (``backends.verl.trainer``).
TRAINER_MODE = "credit_sync"

#: The keys of ``algorithm`` this backend reads (verl's own keys are left to verl).
CREDIT_KEYS = ("credit", "direction", "credit_stats_chunk_size")
SECTION_KEYS = SectionKeys(*(f"algorithm.{key}" for key in CREDIT_KEYS))

#: What the verl backend provides: per-token scalars shipped from verl's actor engine to the
#: trainer (DATC's W0, reduced in the old-log-prob forward with the reward gradient known
#: first, on a path too; P2T's attribution, from the same gradient; the direction model's
#: attention and prefix rewards, scored there on the same tokens; verl's own entropy); the
#: credit step runs on the trainer with the step's whole batch (a batch-wide selection needs
#: no gather) and its response rewards and prompt groups (verl's scores and uids), and the
#: token rewards the reward function gives (``token_rewards`` / ``step_rewards`` in verl's
#: reward extra info, ``backends.verl.credit.given_token_rewards``), without an answer span.
BACKEND = Backend(
    "verl",
    SECTION_KEYS.credit,
    frozenset(
        {
            "unsigned_work",
            "token_entropy",
            "reward_attention",
            "prefix_rewards",
            "reward_attribution",
        }
    ),
    frozenset({"gather", "path_gradient", "groups", "token_rewards"}),
    work_first=True,
    path_work=True,
    hint=(
        "the actor engine ships per-token scalars of the direction model, not its gradient "
        "tensor, and verl's reward managers run in CPU-only Ray actors without a gradient; "
        "run it with the native trainer (python -m backends.torch) or TRL"
    ),
)
#: verl's response-level estimator the strategies split, and its critic estimator, served
#: through ``credit_core.token_rewards.critic_reward_shift``.
RESPONSE_ESTIMATORS = ("grpo",)
CRITIC_ESTIMATORS = ("gae",)
#: verl's rollout sampling keys and their untruncated values.
SAMPLING_OFF: dict[str, tuple[object, ...]] = {"top_k": (-1, 0, None), "top_p": (1.0, None)}


#: verl's reward-model server, enabled, and the model it serves: where that is the direction
#: model, verl's reward is the direction model's own score (the current keys, then the
#: legacy ones verl migrates).
REWARD_MODEL_KEYS = (
    ("reward.reward_model.enable", "reward.reward_model.model_path"),
    ("reward_model.enable", "reward_model.model.path"),
)


@dataclass(frozen=True)
class CreditSettings:
    """The parsed credit keys (``section``) and the process's one ``CreditRun`` (``run``:
    the plan, its strategy built once, and the agreement gate where one is set)."""

    section: CreditSection
    run: CreditRun

    @property
    def plan(self) -> CreditPlan:
        """The run's ``CreditPlan``."""
        return self.run.plan

    @property
    def measures(self) -> bool:
        """Whether each step measures the direction model against verl's reward from the
        scores the engine ships (``SCORES_FIELD``): the strategy reads a direction model
        (``CreditRun.measures``) and verl's reward is not that model's own score."""
        return self.run.measures and not self.run.direction_is_reward


def engine_signals(plan: CreditPlan) -> frozenset[str]:
    """The plan's signals that verl's actor engine computes (``ENGINE_SIGNALS``)."""
    return plan.signals & ENGINE_SIGNALS


def critic_estimator(config: Any) -> bool:
    """Whether ``config``'s ``algorithm.adv_estimator`` is verl's critic estimator (GAE)."""
    return _get(config, "algorithm.adv_estimator") in CRITIC_ESTIMATORS


def work_request(settings: CreditSettings) -> str | None:
    """What the trainer hands the engine with the old-log-prob batch (a JSON string, one
    piece of non-tensor data) when the plan reads a signal the engine computes: those
    ``signals``, the direction model's settings, the tile size and the plan's
    ``reward_grad_points`` (0: the gradient at the sampled tokens), for
    ``reward_attribution`` the strategy's ``null`` (``attribution_null``), and ``scores``:
    true when the trainer measures the direction model against the reward
    (``CreditSettings.measures``: the engine then ships each response's score,
    ``SCORES_FIELD``); None otherwise."""
    signals = engine_signals(settings.plan)
    if not signals:
        return None
    assert settings.section.direction is not None  # credit_settings refuses them without one
    request: dict[str, Any] = {
        "signals": sorted(signals),
        "direction": settings.section.direction.model_dump(mode="json"),
        "chunk_size": settings.section.chunk_size,
        "points": settings.plan.reward_grad_points,
    }
    if "reward_attribution" in signals:
        request["null"] = settings.plan.strategy.attribution_null
    if settings.measures:
        request["scores"] = True
    return json.dumps(request)


def _get(config: Any, path: str) -> Any:
    """``config``'s value at dotted ``path`` (a mapping or an OmegaConf node), or None."""
    node = config
    for key in path.split("."):
        if node is None:
            return None
        node = node.get(key) if isinstance(node, Mapping) or hasattr(node, "get") else None
    return node


def _plain(value: Any) -> Any:
    """An OmegaConf node as plain Python containers; anything else unchanged."""
    try:
        from omegaconf import OmegaConf
    except ImportError:
        return value
    if OmegaConf.is_config(value):
        return OmegaConf.to_container(value, resolve=True)
    return value


def direction_is_reward(config: Any, section: CreditSection) -> bool:
    """Whether verl's reward is the direction model's own score: verl's reward-model server
    is enabled (``REWARD_MODEL_KEYS``) and serves the direction model's ``path``. The
    direction model's agreement with that reward is 1 by construction (logged as
    ``credit/direction_is_reward``), and a gate is refused."""
    path = None if section.direction is None else section.direction.path
    return path is not None and any(
        bool(_get(config, enable)) and _get(config, model) == path
        for enable, model in REWARD_MODEL_KEYS
    )


def credit_settings(config: Any) -> CreditSettings:
    """The ``CreditSettings`` of verl config ``config`` (a mapping or an OmegaConf node);
    ``CreditError`` naming the key of a bad value, of a strategy the backend cannot serve,
    of a gate it cannot apply, or of a verl setting that the strategy's signals do not work
    with. Builds the strategy once: a process calls it once (the trainer; ``credit-verl``'s
    start-up check runs in the driver, the trainer in verl's task runner)."""
    algorithm = _get(config, "algorithm")
    unknown = sorted(
        key
        for key in (_plain(algorithm) or {})
        if str(key).startswith(("credit", "direction")) and key not in CREDIT_KEYS
    )
    if unknown:
        raise CreditError(
            f"algorithm.{unknown[0]}: unknown credit key; the credit keys are "
            f"{', '.join('algorithm.' + k for k in CREDIT_KEYS)}"
        )
    section = parse_section(
        _plain(_get(config, "algorithm.credit")),
        _plain(_get(config, "algorithm.direction")),
        _get(config, "algorithm.credit_stats_chunk_size"),
        SECTION_KEYS,
        gate=True,
    )
    plan = CreditPlan.build(section.credit, BACKEND)
    try:
        run = CreditRun(
            plan, section.credit.gate, direction_is_reward=direction_is_reward(config, section)
        )
    except CreditError as err:  # a gate CreditRun refuses, named credit.gate there
        raise CreditError(f"algorithm.{err}") from err
    settings = CreditSettings(section, run)
    _check_verl_settings(config, settings)
    return settings


#: The actor's Ulysses sequence-parallel size, as verl reads it: the engine's
#: ``fsdp_config`` key, which the deprecated actor key overrides when it is above 1
#: (``FSDPActorConfig.__post_init__`` copies it there).
SEQUENCE_PARALLEL_KEYS = (
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
    "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size",
)


def sequence_parallel_size(config: Any) -> tuple[str, Any]:
    """The actor engine's Ulysses sequence-parallel size and the key it came from, resolved
    as verl resolves it (``SEQUENCE_PARALLEL_KEYS``): the deprecated actor key when it is
    above 1, else ``fsdp_config``'s (1 when neither is set)."""
    deprecated, engine = SEQUENCE_PARALLEL_KEYS
    old = _get(config, deprecated)
    if old is not None and not (isinstance(old, int) and old <= 1):
        return deprecated, old
    value = _get(config, engine)
    return engine, 1 if value is None else value


def _check_verl_settings(config: Any, settings: CreditSettings) -> None:
    """The verl settings the strategy's signals need (``CreditError`` naming the key)."""
    plan = settings.plan
    name = plan.name
    problem = plan.estimator_problem(
        "algorithm.adv_estimator",
        _get(config, "algorithm.adv_estimator"),
        RESPONSE_ESTIMATORS,
        critic=CRITIC_ESTIMATORS,
    )
    if problem is not None:
        raise CreditError(str(problem))
    samples = _get(config, "actor_rollout_ref.rollout.n")
    if (
        name != "uniform"
        and critic_estimator(config)
        and not (isinstance(samples, int) and samples >= 2)
    ):
        raise CreditError(
            f"actor_rollout_ref.rollout.n: {samples!r}; under algorithm.adv_estimator="
            f"{_get(config, 'algorithm.adv_estimator')!r} credit strategy {name!r} is run on "
            "GRPO's group-normalized advantages of each prompt's samples (docs/design.md, "
            "'Credit under a critic'): set it to >= 2"
        )
    policy_side = plan.signals
    if not policy_side:
        return
    if _get(config, "algorithm.rollout_correction.bypass_mode"):
        raise CreditError(
            "algorithm.rollout_correction.bypass_mode: true skips the old-log-prob forward "
            f"that gives credit strategy {name!r} its signals {sorted(policy_side)}"
        )
    if _get(config, "actor_rollout_ref.rollout.multi_turn.enable"):
        raise CreditError(
            "actor_rollout_ref.rollout.multi_turn.enable: true; credit strategy "
            f"{name!r} reads per-token signals of single-turn responses only"
        )
    if engine_signals(plan) and settings.section.direction is None:
        raise CreditError(
            f"algorithm.direction: credit strategy {name!r} reads "
            f"{sorted(engine_signals(plan))} of a frozen differentiable reward model: set "
            "algorithm.direction (e.g. {kind: seq_classification, path: ...}, "
            "docs/reward_models.md)"
        )
    key, sp = sequence_parallel_size(config)
    if engine_signals(plan) and sp != 1:
        raise CreditError(
            f"{key}: {sp!r}; Ulysses sequence parallelism splits each sequence (its logits "
            f"and its per-token outputs) over ranks, and credit strategy {name!r}'s signals "
            f"{sorted(engine_signals(plan))} are computed from whole sequences on one rank: "
            "set it to 1"
        )
    if "unsigned_work" not in plan.signals:
        return
    sampling = {
        f"actor_rollout_ref.rollout.{key}": _get(config, f"actor_rollout_ref.rollout.{key}")
        for key in SAMPLING_OFF
    }
    problem = plan.sampling_problem(sampling, SAMPLING_OFF)
    if problem is not None:
        raise CreditError(str(problem))
    if _get(config, "actor_rollout_ref.model.use_fused_kernels"):
        raise CreditError(
            "actor_rollout_ref.model.use_fused_kernels: true never materializes the logits "
            f"that credit strategy {name!r}'s W0 is reduced from; set it to false"
        )
    strategy_key = _get(config, "actor_rollout_ref.actor.strategy")
    if strategy_key not in (None, "fsdp", "fsdp2"):
        raise CreditError(
            f"actor_rollout_ref.actor.strategy: {strategy_key!r}; the W0 reduction lives in "
            "the FSDP engine subclass: use fsdp or fsdp2"
        )
