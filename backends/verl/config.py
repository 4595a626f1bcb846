"""The credit keys of verl's Hydra config, parsed and checked at start-up.

A verl run takes the strategy, its direction model and the tile size beside verl's own
algorithm keys::

    algorithm:
      adv_estimator: grpo
      credit: datc                          # or {name: datc, beta: 1.0}
      direction: {kind: seq_classification, path: /models/rm}
      credit_stats_chunk_size: 4096         # optional

``credit_settings(config)`` turns them into ``CreditSettings`` and refuses, with a
``CreditError`` naming the key, a bad value or a strategy this backend cannot serve
(``unserved_reason``): the backend ships per-token scalars from verl's actor engine to the
trainer (DATC's unsigned work W0, verl's own entropy), not the reward model's gradient
tensor, its attention or its prefix scores.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from adapters.config import RewardModelConfig
from backends.common.config_values import parse_credit as parse_config_credit
from backends.common.config_values import parse_direction as parse_config_direction
from backends.common.config_values import trained_model_refusal
from credit_core import CreditConfig, CreditError, get_strategy, strategy_class
from credit_core.answer_reweighting import native_only_reason
from credit_core.policy_stats import DEFAULT_CHUNK_SIZE

#: The ``trainer.v1.trainer_mode`` of ``CreditPPOTrainer`` (``backends.verl.trainer``).
TRAINER_MODE = "credit_sync"

#: The keys of ``algorithm`` this backend reads (verl's own keys are left to verl).
CREDIT_KEYS = ("credit", "direction", "credit_stats_chunk_size")

#: The signals a served strategy may read, and where each comes from.
SERVED_SIGNALS: dict[str, str] = {
    "unsigned_work": "DATC's W0, reduced in the actor engine from the old-log-prob forward",
    "token_entropy": "verl's own entropy of the old-log-prob forward",
}


@dataclass(frozen=True)
class CreditSettings:
    """The parsed credit keys: the strategy, the direction model (None when the strategy
    reads none of its signals) and the vocabulary tile size of the streamed W0."""

    credit: CreditConfig
    direction: RewardModelConfig | None
    chunk_size: int

    @property
    def reads(self) -> frozenset[str]:
        """The signals the strategy reads, the reward gradient known first (W0 streamed)."""
        return strategy_class(self.credit.name).signals_to_compute(reward_grad_first=True)

    @property
    def needs_work(self) -> bool:
        """Whether the actor engine reduces W0 in the old-log-prob forward."""
        return "unsigned_work" in self.reads

    def work_request(self) -> str:
        """What the trainer hands the engine with the old-log-prob batch (a JSON string, one
        piece of non-tensor data): the direction model's settings, the tile size and the
        strategy's ``reward_grad_points`` (0: the gradient at the sampled tokens)."""
        assert self.direction is not None
        return json.dumps(
            {
                "direction": self.direction.model_dump(mode="json"),
                "chunk_size": self.chunk_size,
                "points": get_strategy(self.credit).reward_grad_points,
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


def parse_credit(value: Any) -> CreditConfig:
    """``algorithm.credit``: a strategy name or ``{name: ..., <params>}`` (default uniform)."""
    return parse_config_credit(_plain(value), "algorithm.credit")


def parse_direction(value: Any) -> RewardModelConfig | None:
    """``algorithm.direction``: a ``RewardModelConfig`` mapping (docs/reward_models.md)."""
    return parse_config_direction(_plain(value), "algorithm.direction")


def unserved_reason(credit: CreditConfig) -> str | None:
    """Why this backend cannot serve strategy ``credit``, or None when it can."""
    refusal = trained_model_refusal(credit.name, "verl")
    if refusal is not None:
        return refusal
    cls = strategy_class(credit.name)
    native_only = native_only_reason(cls, "verl")
    if native_only is not None:
        return native_only
    unserved = sorted(cls.signals_to_compute(reward_grad_first=True) - SERVED_SIGNALS.keys())
    if unserved:
        return (
            f"it reads {unserved}; the verl backend ships per-token scalars from the actor "
            f"engine to the trainer ({sorted(SERVED_SIGNALS)}), while verl's reward managers "
            "run in CPU-only Ray actors without a gradient, attention or prefix scores"
        )
    return None


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
    credit = parse_credit(_get(config, "algorithm.credit"))
    reason = unserved_reason(credit)
    if reason is not None:
        raise CreditError(f"algorithm.credit: strategy {credit.name!r} is not served: {reason}")
    chunk = _get(config, "algorithm.credit_stats_chunk_size")
    chunk = DEFAULT_CHUNK_SIZE if chunk is None else chunk
    if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1:
        raise CreditError(
            f"algorithm.credit_stats_chunk_size: expected an integer >= 1, got {chunk!r}"
        )
    settings = CreditSettings(credit, parse_direction(_get(config, "algorithm.direction")), chunk)
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
    name = settings.credit.name
    estimator = _get(config, "algorithm.adv_estimator")
    if name != "uniform" and estimator != "grpo":
        raise CreditError(
            f"algorithm.adv_estimator: {estimator!r}; credit strategy {name!r} spreads a "
            "response's GRPO advantage over its tokens: set algorithm.adv_estimator=grpo"
        )
    policy_side = settings.reads & SERVED_SIGNALS.keys()
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
    if not settings.needs_work:
        return
    if settings.direction is None:
        raise CreditError(
            f"algorithm.direction: credit strategy {name!r} reads the reward gradient of a "
            "frozen differentiable reward model: set algorithm.direction (e.g. "
            "{kind: seq_classification, path: ...}, docs/reward_models.md)"
        )
    for key, off in (("top_k", (-1, 0, None)), ("top_p", (1.0, None))):
        value = _get(config, f"actor_rollout_ref.rollout.{key}")
        if value not in off:
            raise CreditError(
                f"actor_rollout_ref.rollout.{key}: {value!r} truncates the sampling "
                f"distribution, but credit strategy {name!r} reads the distribution actually "
                f"sampled from; leave {key} off"
            )
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
