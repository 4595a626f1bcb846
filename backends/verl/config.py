"""The credit keys of verl's Hydra config, parsed and checked at start-up.

A verl run takes the strategy, its direction model and the tile size beside verl's own
algorithm keys::

    algorithm:
      adv_estimator: grpo
      credit: datc                          # or {name: datc, beta: 1.0}
      direction: {kind: seq_classification, path: /models/rm}
      credit_stats_chunk_size: 4096         # optional

``credit_settings(config)`` parses them into the shared ``CreditSection`` and builds the
run's ``CreditPlan`` on ``BACKEND`` (the strategy, once), refusing with a ``CreditError``
naming the key a bad value or a strategy this backend cannot serve: the backend ships
per-token scalars from verl's actor engine to the trainer (DATC's unsigned work W0, verl's
own entropy), not the reward model's gradient tensor, its attention or its prefix scores.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from backends.common.config_values import CreditSection, SectionKeys, parse_section
from credit_core import CreditError
from credit_core.plan import Backend, CreditPlan

#: The ``trainer.v1.trainer_mode`` of ``CreditPPOTrainer`` (``backends.verl.trainer``).
TRAINER_MODE = "credit_sync"

#: The keys of ``algorithm`` this backend reads (verl's own keys are left to verl).
CREDIT_KEYS = ("credit", "direction", "credit_stats_chunk_size")
SECTION_KEYS = SectionKeys(*(f"algorithm.{key}" for key in CREDIT_KEYS))

#: What the verl backend provides: per-token scalars shipped from verl's actor engine to the
#: trainer (DATC's W0, reduced in the old-log-prob forward with the reward gradient known
#: first, on a path too; verl's own entropy); the credit step runs on the trainer with the
#: step's whole batch (a batch-wide selection needs no gather), without rewards/groups or
#: an answer span.
BACKEND = Backend(
    "verl",
    SECTION_KEYS.credit,
    frozenset({"unsigned_work", "token_entropy"}),
    frozenset({"gather", "path_gradient"}),
    work_first=True,
    path_work=True,
    hint=(
        "verl's reward managers run in CPU-only Ray actors without a gradient, attention or "
        "prefix scores; run it with the native trainer (python -m backends.torch) or TRL"
    ),
)
#: verl's rollout sampling keys and their untruncated values.
SAMPLING_OFF: dict[str, tuple[object, ...]] = {"top_k": (-1, 0, None), "top_p": (1.0, None)}


@dataclass(frozen=True)
class CreditSettings:
    """The parsed credit keys (``section``) and the run's ``plan``."""

    section: CreditSection
    plan: CreditPlan


def work_request(settings: CreditSettings) -> str:
    """What the trainer hands the engine with the old-log-prob batch when the plan reads W0
    (a JSON string, one piece of non-tensor data): the direction model's settings, the tile
    size and the plan's ``reward_grad_points`` (0: the gradient at the sampled tokens)."""
    assert settings.section.direction is not None  # credit_settings refuses W0 without one
    return json.dumps(
        {
            "direction": settings.section.direction.model_dump(mode="json"),
            "chunk_size": settings.section.chunk_size,
            "points": settings.plan.reward_grad_points,
        }
    )


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


def credit_settings(config: Any) -> CreditSettings:
    """The ``CreditSettings`` of verl config ``config`` (a mapping or an OmegaConf node);
    ``CreditError`` naming the key of a bad value, of a strategy the backend cannot serve,
    or of a verl setting that the strategy's signals do not work with."""
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
    )
    settings = CreditSettings(section, CreditPlan.build(section.credit, BACKEND))
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
        "algorithm.adv_estimator", _get(config, "algorithm.adv_estimator"), ("grpo",)
    )
    if problem is not None:
        raise CreditError(str(problem))
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
    if "unsigned_work" not in plan.signals:
        return
    if settings.section.direction is None:
        raise CreditError(
            f"algorithm.direction: credit strategy {name!r} reads the reward gradient of a "
            "frozen differentiable reward model: set algorithm.direction (e.g. "
            "{kind: seq_classification, path: ...}, docs/reward_models.md)"
        )
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
    key, sp = sequence_parallel_size(config)
    if sp != 1:
        raise CreditError(
            f"{key}: {sp!r}; Ulysses sequence parallelism splits each sequence's logits over "
            f"ranks, and credit strategy {name!r}'s W0 reduction needs them on one rank: set "
            "it to 1"
        )
    strategy_key = _get(config, "actor_rollout_ref.actor.strategy")
    if strategy_key not in (None, "fsdp", "fsdp2"):
        raise CreditError(
            f"actor_rollout_ref.actor.strategy: {strategy_key!r}; the W0 reduction lives in "
            "the FSDP engine subclass: use fsdp or fsdp2"
        )
