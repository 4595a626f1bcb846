"""Configuration of the reward side, and the builders that turn it into objects.

Two things are configured apart (docs/reward_models.md: the reward that sets the advantage may be a
rule; the differentiable model then only supplies the direction):

- the **direction model** (``RewardModelConfig``): a frozen differentiable RM, built by
  ``build_direction_model`` into a ``DirectionModel``;
- the **reward** (``ScorerConfig``): ``kind: model`` (default: the direction model's own
  reward; or another RM given as ``model``), ``kind: callable`` with
  ``function: "pkg.module:name"``, a ``TextScorer``, or ``kind: prm``, a ``model`` that
  scores each reasoning step (``PRMScorer``); built by ``build_scorer``.

``RewardSignalsConfig`` groups them (``direction_model`` + ``reward``, the reward
defaulting to the direction model) and ``build_reward_signals`` builds both. Every model
forbids unknown keys; a key that does not apply to the chosen ``kind`` is an error naming it.

``RewardModelConfig.kind`` is a key of ``REWARD_MODEL_KINDS`` (one entry per kind: its
settings, the required ones, its builder); docs/reward_models.md describes every kind's
settings, ``kind: module`` with a factory included.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from adapters.direction import DirectionModel
from adapters.minilm import load_minilm
from adapters.partitioned import outside_zero3_init
from adapters.reward_models import EncoderSimilarityRM, ModuleRM, SeqClassificationRM
from adapters.scorers import (
    CallableScorer,
    ModelScorer,
    PRMScorer,
    RewardSignals,
    Scorer,
    import_object,
)
from credit_core import CreditError

__all__ = [
    "REWARD_MODEL_KINDS",
    "SCORER_KINDS",
    "RewardModelConfig",
    "RewardModelKind",
    "RewardSignalsConfig",
    "ScorerConfig",
    "build_direction_model",
    "build_reward_signals",
    "build_scorer",
]

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}

_COMMON_FIELDS = frozenset({"kind", "max_length", "dtype", "on_nonfinite_grad"})


def _given(model: BaseModel) -> set[str]:
    """The fields set to something other than their default: a resolved config written
    back with every default filled in (``factory: null`` under an ``encoder_similarity``)
    sets nothing more than the one it was resolved from."""
    fields = type(model).model_fields
    return {
        name
        for name in model.model_fields_set
        if getattr(model, name) != fields[name].get_default(call_default_factory=True)
    }


class RewardModelConfig(BaseModel):
    """A differentiable reward model (the direction model); see the module docstring."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str = Field(description="one of REWARD_MODEL_KINDS")
    path: str | None = Field(None, description="local Hugging Face model folder")
    target_text: str | None = Field(None, description="encoder_similarity: the target")
    factory: str | None = Field(None, description="module: 'pkg.module:function'")
    factory_kwargs: dict[str, Any] = Field(default_factory=dict)
    include_prompt: bool | None = Field(None, description="score prompt + response")
    padding_side: Literal["left", "right"] | None = None
    max_length: int | None = Field(None, ge=2, description="RM input tokens (truncation)")
    dtype: Literal["float32", "float64", "bfloat16", "float16"] = "float32"
    on_nonfinite_grad: Literal["error", "pass"] = Field(
        "error", description="non-finite reward gradient: raise, or pass it to the strategy"
    )

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, kind: str) -> str:
        if kind not in REWARD_MODEL_KINDS:
            raise ValueError(f"unknown kind {kind!r}; known kinds: {sorted(REWARD_MODEL_KINDS)}")
        return kind

    @model_validator(mode="after")
    def _fields_match_kind(self) -> RewardModelConfig:
        spec = REWARD_MODEL_KINDS[self.kind]
        for name in sorted(_given(self) - spec.fields - _COMMON_FIELDS):
            raise ValueError(f"{name}: not a setting of kind {self.kind!r}")
        for name in spec.required:
            if getattr(self, name) is None:
                raise ValueError(f"{name}: required for kind {self.kind!r}")
        return self


#: Each ``ScorerConfig.kind``: its settings beside ``kind``, and the required ones.
SCORER_KINDS: dict[str, tuple[frozenset[str], tuple[str, ...]]] = {
    "callable": (frozenset({"function", "kwargs"}), ("function",)),
    "model": (frozenset({"model"}), ()),
    "prm": (frozenset({"model", "step_separator"}), ("model", "step_separator")),
}


class ScorerConfig(BaseModel):
    """The reward that sets the advantage.

    ``kind: callable``: ``function`` ("pkg.module:name", a ``TextScorer``), called with
    ``kwargs`` bound; one with a ``labels`` parameter also gets each row's label (the
    ``label`` of its prompt in the training data). ``kind: model``: ``model`` (another
    ``RewardModelConfig``) or, when omitted, the direction model's own reward. ``kind:
    prm``: ``model`` (a ``RewardModelConfig``, required) scores the prompt with each
    response prefix that ends a step, a step ending at each token whose text contains
    ``step_separator`` (a non-empty string, required) and at the response's last token
    (``PRMScorer``; docs/reward_models.md, "A process reward model").
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["callable", "model", "prm"]
    function: str | None = Field(None, description="callable: 'pkg.module:name'")
    kwargs: dict[str, Any] = Field(default_factory=dict)
    model: RewardModelConfig | None = None
    step_separator: str | None = Field(None, description="prm: the text that ends a step")

    @model_validator(mode="after")
    def _fields_match_kind(self) -> ScorerConfig:
        allowed, required = SCORER_KINDS[self.kind]
        for name in sorted(_given(self) - allowed - {"kind"}):
            raise ValueError(f"{name}: not a setting of kind {self.kind!r}")
        for name in required:
            if getattr(self, name) is None:
                raise ValueError(f"{name}: required for kind {self.kind!r}")
        if self.step_separator == "":
            raise ValueError("step_separator: expected a non-empty string, got ''")
        return self


class RewardSignalsConfig(BaseModel):
    """``direction_model`` (differentiable) and ``reward`` (default: the direction model)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    direction_model: RewardModelConfig | None = None
    reward: ScorerConfig | None = None

    @model_validator(mode="after")
    def _something_sets_the_reward(self) -> RewardSignalsConfig:
        if self.reward is None and self.direction_model is None:
            raise ValueError("reward: required when no direction_model is configured")
        r = self.reward
        if r is not None and r.kind == "model" and r.model is None and self.direction_model is None:
            raise ValueError("reward.model: required when no direction_model is configured")
        return self


def _parse(cls: type[BaseModel], cfg: Any) -> Any:
    return cfg if isinstance(cfg, cls) else cls.model_validate(cfg)


def _tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


@dataclass(frozen=True)
class CommonSettings:
    """What every builder passes on to its ``EmbeddingDirectionModel`` unchanged."""

    policy_tokenizer: Any
    device: str | torch.device
    dtype: torch.dtype
    kwargs: dict[str, Any]  # policy_vocab_size, max_length, on_nonfinite_grad[, include_prompt]


def _build_seq_classification(c: RewardModelConfig, s: CommonSettings) -> DirectionModel:
    from transformers import AutoModelForSequenceClassification

    assert c.path is not None
    model = AutoModelForSequenceClassification.from_pretrained(
        c.path, local_files_only=True, dtype=s.dtype
    ).to(s.device)
    return SeqClassificationRM(
        model, _tokenizer(c.path), s.policy_tokenizer, padding_side=c.padding_side, **s.kwargs
    )


def _build_encoder_similarity(c: RewardModelConfig, s: CommonSettings) -> DirectionModel:
    from transformers import AutoModel

    assert c.target_text is not None
    if c.path is None:
        encoder, tokenizer = load_minilm(device=s.device, dtype=s.dtype)
    else:
        encoder = AutoModel.from_pretrained(c.path, local_files_only=True, dtype=s.dtype)
        encoder, tokenizer = encoder.to(s.device), _tokenizer(c.path)
    return EncoderSimilarityRM(encoder, tokenizer, s.policy_tokenizer, c.target_text, **s.kwargs)


def _build_module(c: RewardModelConfig, s: CommonSettings) -> DirectionModel:
    assert c.factory is not None
    made = import_object(c.factory)(**c.factory_kwargs)
    if isinstance(made, DirectionModel):
        return made
    if not isinstance(made, tuple) or len(made) not in (2, 3):
        raise CreditError(
            f"factory {c.factory!r}: expected a DirectionModel, (module, embedding) or "
            f"(module, embedding, tokenizer), got {type(made).__name__}"
        )
    module, embedding, *tok = made
    return ModuleRM(
        module.to(device=s.device, dtype=s.dtype),
        embedding.to(device=s.device, dtype=s.dtype),
        tokenizer=tok[0] if tok else None,
        policy_tokenizer=s.policy_tokenizer,
        **s.kwargs,
    )


@dataclass(frozen=True)
class RewardModelKind:
    """One kind of direction model: its own settings (beside the common ``kind``,
    ``max_length``, ``dtype``, ``on_nonfinite_grad``), the required ones, and its builder."""

    fields: frozenset[str]
    required: tuple[str, ...]
    build: Callable[[RewardModelConfig, CommonSettings], DirectionModel]


#: Every ``RewardModelConfig.kind``: a new kind is one entry here (docs/reward_models.md).
REWARD_MODEL_KINDS: dict[str, RewardModelKind] = {
    "seq_classification": RewardModelKind(
        frozenset({"path", "include_prompt", "padding_side"}),
        ("path",),
        _build_seq_classification,
    ),
    "encoder_similarity": RewardModelKind(
        frozenset({"path", "target_text", "include_prompt"}),
        ("target_text",),
        _build_encoder_similarity,
    ),
    "module": RewardModelKind(
        frozenset({"factory", "factory_kwargs", "include_prompt"}), ("factory",), _build_module
    ),
}


def build_direction_model(
    cfg: RewardModelConfig | dict[str, Any],
    policy_tokenizer: Any,
    *,
    device: str | torch.device = "cpu",
    policy_vocab_size: int | None = None,
) -> DirectionModel:
    """The ``DirectionModel`` that ``cfg`` describes, on ``device``, frozen, eval mode.

    ``policy_vocab_size`` should be the policy LM head's number of outputs when it differs
    from ``len(policy_tokenizer)`` (padded vocabularies): ``reward_embedding`` gets that
    many rows. Models load with ``local_files_only=True``, and whole even while a ZeRO-3
    trainer holds transformers' live DeepSpeed config (``outside_zero3_init``): the direction
    model is a full frozen copy on every process, which no DeepSpeed engine wraps.
    """
    c: RewardModelConfig = _parse(RewardModelConfig, cfg)
    kwargs: dict[str, Any] = {
        "policy_vocab_size": policy_vocab_size,
        "max_length": c.max_length,
        "on_nonfinite_grad": c.on_nonfinite_grad,
        # unset: each model's own default (see adapters.reward_models)
        **({} if c.include_prompt is None else {"include_prompt": c.include_prompt}),
    }
    settings = CommonSettings(policy_tokenizer, device, DTYPES[c.dtype], kwargs)
    with outside_zero3_init():  # no DeepSpeed engine wraps it: it must load whole
        return REWARD_MODEL_KINDS[c.kind].build(c, settings)


def build_scorer(
    cfg: ScorerConfig | dict[str, Any] | None,
    policy_tokenizer: Any,
    direction_model: DirectionModel | None,
    *,
    device: str | torch.device = "cpu",
    policy_vocab_size: int | None = None,
) -> Scorer:
    """The ``Scorer`` of ``cfg``; None (or ``kind: model`` without ``model``) means the
    direction model's own reward; ``kind: prm`` is a ``PRMScorer`` on its own ``model``."""
    c: ScorerConfig = _parse(ScorerConfig, cfg or {"kind": "model"})
    if c.kind == "callable":
        assert c.function is not None
        fn = import_object(c.function)
        if c.kwargs:
            fn = functools.partial(fn, **c.kwargs)
        return CallableScorer(fn, policy_tokenizer, name=c.function)
    if c.model is not None:
        model = build_direction_model(
            c.model, policy_tokenizer, device=device, policy_vocab_size=policy_vocab_size
        )
        if c.kind == "prm":
            assert c.step_separator is not None
            return PRMScorer(model, policy_tokenizer, c.step_separator)
        return ModelScorer(model)
    if direction_model is None:
        raise CreditError("reward: kind 'model' without 'model' needs a direction model")
    return ModelScorer(direction_model)


def build_reward_signals(
    cfg: RewardSignalsConfig | dict[str, Any],
    policy_tokenizer: Any,
    *,
    device: str | torch.device = "cpu",
    policy_vocab_size: int | None = None,
) -> RewardSignals:
    """Direction model (if configured) and scorer of ``cfg`` (see ``RewardSignals``)."""
    c: RewardSignalsConfig = _parse(RewardSignalsConfig, cfg)
    dm = None
    if c.direction_model is not None:
        dm = build_direction_model(
            c.direction_model, policy_tokenizer, device=device, policy_vocab_size=policy_vocab_size
        )
    scorer = build_scorer(
        c.reward, policy_tokenizer, dm, device=device, policy_vocab_size=policy_vocab_size
    )
    return RewardSignals(scorer=scorer, direction_model=dm)
