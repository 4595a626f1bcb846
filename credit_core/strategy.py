"""The strategy contract: what every credit strategy, built-in or plugin, provides."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeVar, final

import torch
from pydantic import BaseModel, ConfigDict, Field

from credit_core.allocation import (
    UNIFORM_DIAGNOSTICS,
    CreditDiagnostics,
    NonFinitePolicy,
    allocate_weights,
)
from credit_core.attribution import DEFAULT_NULL, NullEmbedding
from credit_core.batch import SIGNALS, CreditBatch
from credit_core.errors import CreditError
from credit_core.trained_model import ImplicitPRMSpec

#: The std of the Gaussian noise on the reasoning tokens' input embeddings at which a backend
#: takes ``answer_saliency`` (the OAR-G authors' ``noise_std``; docs/design.md,
#: "Answer-gradient reweighting (OAR-G)").
DEFAULT_ANSWER_NOISE_STD = 1e-3

#: ``CreditStrategy.critic_reward_form``: mean-preserving weights, or the paper form's rewards.
CriticRewardForm = Literal["weights", "token_rewards"]


class NoParams(BaseModel):
    """Parameters of a strategy that takes none; any key is rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ScoreParams(BaseModel):
    """Parameters shared by every score-based strategy (docs/design.md, "From one advantage
    to many").

    Strict: a float takes a float or an int, never a bool or a string (``beta=True`` or
    ``beta="2"`` is a mistake, not a 1.0 or a 2.0); an int takes an int only.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    beta: float = Field(1.0, gt=0.0, allow_inf_nan=False, description="softmax temperature")
    lam: float = Field(0.5, ge=0.0, le=1.0, description="mixing weight with uniform")
    on_nonfinite: Literal["error", "uniform"] = Field(
        "error", description="non-finite score in a response: raise, or uniform weights"
    )


@dataclass(frozen=True)
class CreditResult:
    """What ``assign_with_diagnostics`` returns.

    ``token_advantages`` (B, T) float32, exactly 0 where the mask is False;
    ``diagnostics`` summarizes the weights (see ``CreditDiagnostics``); ``token_rewards``
    (B, T) float64 or None: a paper-form strategy's token rewards r_t (0 at padding), from
    which its advantages were formed, and which a critic estimator takes as they are
    (``credit_core.token_rewards.critic_reward_shift``).
    """

    token_advantages: torch.Tensor
    diagnostics: CreditDiagnostics
    token_rewards: torch.Tensor | None = None


class CreditStrategy(ABC):
    """Base class of every strategy.

    Class attributes a subclass sets:

    - ``name``: the registry key (unique across all plugins).
    - ``requires``: the signals ``assign`` reads, a subset of ``SIGNALS`` ("reward_grad",
      "policy_stats", "unsigned_work", "token_entropy", "reward_attention",
      "prefix_rewards", "reward_attribution", "implicit_log_ratio"); backends compute only these.
    - ``work_requires``: None, or the signals that suffice instead of ``requires`` when the
      backend computes DATC's unsigned work W0 directly (it must contain "unsigned_work");
      DATC-family strategies declare ``{"unsigned_work"}`` next to ``requires =
      {"reward_grad", "policy_stats"}``. Backends ask ``signals_to_compute``.
    - ``Params``: a pydantic model of the parameters (unknown keys rejected).
    - ``gathers``: True when ``assign`` reads the values of the step's other processes
      through ``CreditBatch.gather``, called exactly once per call (a collective): a
      backend then has every process call ``assign_credit`` at every credit step; one
      without a valid token takes part there with an empty tensor.

    - ``reads_answer_span``: True when ``assign`` reads each response's answer span
      (``CreditBatch.answer_mask``), which the task declares; a backend without one refuses
      the strategy at start-up.

    - ``reads_token_rewards``: True when ``assign`` reads the token rewards the user's reward
      function gives (``CreditBatch.token_rewards``, a ``TokenRewards``); a backend that does
      not pass them refuses the strategy at start-up (the plan's feature ``token_rewards``).

    ``reads_groups`` says whether ``assign`` reads the response rewards and groups
    (``CreditBatch.rewards``/``groups``), which backends pass to ``assign_credit``.

    ``reward_grad_points`` says where the ``reward_grad`` the strategy reads is taken: 0 (the
    default, DATC as published) at the sampled tokens' embeddings; n >= 1 averaged over n
    points of the path from them to the policy's expected embeddings (docs/design.md,
    "Curvature-robust direction"). A backend that cannot take that gradient refuses the
    strategy.

    ``attribution_null`` says which null embedding e_null a backend computing
    ``reward_attribution`` subtracts (``credit_core.attribution``; ``DEFAULT_NULL`` unless the
    strategy says otherwise). A backend whose direction model has no such embedding refuses
    the strategy.

    Subclasses implement ``assign_with_diagnostics``; ``assign`` returns its tensor. A
    strategy with mutable state (a random stream, running statistics) overrides
    ``state_dict``/``load_state_dict`` so that a resumed run continues it exactly.
    """

    name: ClassVar[str]
    requires: ClassVar[frozenset[str]] = frozenset()
    work_requires: ClassVar[frozenset[str] | None] = None
    Params: ClassVar[type[BaseModel]] = NoParams
    gathers: ClassVar[bool] = False
    reads_answer_span: ClassVar[bool] = False
    reads_token_rewards: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        alt = cls.work_requires
        if alt is not None and not (
            isinstance(alt, frozenset) and "unsigned_work" in alt and alt <= SIGNALS
        ):
            raise CreditError(
                f"strategy class {cls.__qualname__}: 'work_requires' must be None or a "
                f"frozenset within {sorted(SIGNALS)} containing 'unsigned_work', got {alt!r}"
            )

    def __init__(self, params: BaseModel | None = None) -> None:
        self.params = params if params is not None else self.Params()

    @classmethod
    def signals_to_compute(cls, *, reward_grad_first: bool) -> frozenset[str]:
        """The signals a backend computes for this strategy.

        ``work_requires`` when the backend has the reward gradient before it takes the policy
        statistics (so it can stream W0 instead of ``PolicyStats``) and the strategy accepts
        W0; ``requires`` otherwise.
        """
        if reward_grad_first and cls.work_requires is not None:
            return cls.work_requires
        return cls.requires

    @property
    def reward_grad_points(self) -> int:
        """Points of the path at which ``reward_grad`` is averaged; 0: at the samples."""
        return 0

    @property
    def attribution_null(self) -> NullEmbedding:
        """The null embedding of the ``reward_attribution`` this strategy reads."""
        return DEFAULT_NULL

    @property
    def answer_noise_std(self) -> float:
        """The std of the noise on the reasoning tokens' input embeddings at which a backend
        takes ``answer_saliency`` for this strategy (read only when it requires that signal)."""
        return DEFAULT_ANSWER_NOISE_STD

    @property
    def reads_groups(self) -> bool:
        """Whether ``assign`` reads ``batch.rewards`` and ``batch.groups`` (a strategy whose
        token advantages are formed within each group, e.g. a paper-form token reward turned
        into advantages by ``group_return_advantages``); a backend that cannot pass them
        refuses the strategy at start-up."""
        return False

    @classmethod
    def critic_form(cls, params: BaseModel) -> CriticRewardForm | None:
        """How a critic estimator (PPO's GAE) takes the credit of this strategy with
        ``params`` as token rewards (docs/design.md, "Credit under a critic"): ``"weights"``
        for token advantages A_t = A_i w_t that keep each response's mean (the reward's group
        deviation is moved between tokens by w_t - 1), ``"token_rewards"`` for a paper form's
        own r_t (``CreditResult.token_rewards``), None where the token advantages are no
        redistribution of the response reward (a backend refuses the strategy with ``gae``).
        A class method, so that a config is checked without building a strategy (one
        instance per process); subclasses override this, not ``critic_reward_form``."""
        return "weights"

    @final
    @property
    def critic_reward_form(self) -> CriticRewardForm | None:
        """``critic_form`` of this instance's parameters."""
        return type(self).critic_form(self.params)

    @property
    def implicit_prm(self) -> ImplicitPRMSpec | None:
        """None, or how a backend hosts the trainable implicit PRM whose log ratio against
        the reference policy this strategy reads (``implicit_log_ratio``; PRIME): a second
        trainable model, built from the reference policy, updated every step on the outcome
        labels and checkpointed with the policy. A backend that cannot host one refuses the
        strategy at start-up (docs/backends.md)."""
        return None

    def signals_for(self, batch: CreditBatch) -> frozenset[str]:
        """The signals this strategy reads from ``batch``: ``work_requires`` if the batch
        carries ``unsigned_work`` and the strategy accepts it, ``requires`` otherwise."""
        if batch.unsigned_work is not None and self.work_requires is not None:
            return self.work_requires
        return self.requires

    def assign(self, batch: CreditBatch) -> torch.Tensor:
        """Token advantages (B, T) float32 for ``batch``; 0 where ``batch.mask`` is False."""
        return self.assign_with_diagnostics(batch).token_advantages

    @abstractmethod
    def assign_with_diagnostics(self, batch: CreditBatch) -> CreditResult:
        """Token advantages and diagnostics for ``batch``."""

    def state_dict(self) -> dict[str, Any]:
        """Mutable state to checkpoint (tensors and plain values); none by default."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned; a stateless strategy accepts only ``{}``."""
        if state:
            raise CreditError(
                f"strategy {self.name!r} has no state to load, got keys {sorted(state)}"
            )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, params={self.params!r})"


_S = TypeVar("_S", bound=type[CreditStrategy])
#: The built-in strategy classes by name, in the order their modules registered them.
_BUILTINS: dict[str, type[CreditStrategy]] = {}


def builtin(cls: _S) -> _S:
    """Class decorator: register ``cls`` as a built-in strategy. The registry serves the
    built-ins through the same ``credit_core_strategies`` hook as any plugin's
    (``credit_core.builtin_strategies``). A second class under a registered name is a
    ``CreditError``."""
    known = _BUILTINS.get(cls.name)
    if known is not None and known.__qualname__ != cls.__qualname__:
        raise CreditError(
            f"built-in strategy {cls.name!r}: registered by {known.__qualname__} already, "
            f"not {cls.__qualname__}"
        )
    _BUILTINS[cls.name] = cls
    return cls


def builtin_classes() -> tuple[type[CreditStrategy], ...]:
    """The classes registered with ``builtin``, in registration order."""
    return tuple(_BUILTINS.values())


@builtin
class UniformStrategy(CreditStrategy):
    """Plain GRPO: every valid token gets the response advantage (w = 1)."""

    name = "uniform"

    def assign_with_diagnostics(self, batch: CreditBatch) -> CreditResult:
        adv = batch.advantages.float().unsqueeze(1).expand_as(batch.mask)
        token_adv = torch.where(batch.mask, adv, 0.0)
        return CreditResult(token_adv, UNIFORM_DIAGNOSTICS)


class ScoreStrategy(CreditStrategy):
    """A strategy defined by per-token scores s_t, allocated by the shared rule.

    Subclasses implement ``scores(batch) -> (B, T)``; ``A_t = A * w_t`` with the weights of
    ``allocate_weights``. Override ``weights`` to post-process the weights (e.g. shuffling).
    """

    Params: ClassVar[type[BaseModel]] = ScoreParams
    params: ScoreParams

    @abstractmethod
    def scores(self, batch: CreditBatch) -> torch.Tensor:
        """Per-token scores (B, T); values at padded positions are ignored."""

    def weights(self, batch: CreditBatch) -> tuple[torch.Tensor, CreditDiagnostics]:
        """Token weights (B, T) and diagnostics from ``scores``."""
        p = self.params
        on_nonfinite: NonFinitePolicy = p.on_nonfinite
        return allocate_weights(
            self.scores(batch),
            batch.mask,
            beta=p.beta,
            lam=p.lam,
            on_nonfinite=on_nonfinite,
            score_name=f"{self.name} scores",
        )

    def assign_with_diagnostics(self, batch: CreditBatch) -> CreditResult:
        batch.require(self.signals_for(batch), self.name)
        w, diag = self.weights(batch)
        adv = batch.advantages.to(w.dtype).unsqueeze(1) * w
        return CreditResult(adv.to(torch.float32), diag)


class SeededStream(CreditStrategy):
    """Mixin of a strategy that draws from a random stream: ``self.generator``, a CPU
    ``torch.Generator`` seeded once from ``params.seed`` at construction, advancing with
    every call; its state is the strategy's checkpointed state (``{"generator": ...}``), so
    a resumed run continues the stream exactly."""

    generator: torch.Generator

    def __init__(self, params: BaseModel | None = None) -> None:
        super().__init__(params)
        seed = getattr(self.params, "seed", None)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise CreditError(
                f"strategy {self.name!r}: a seeded stream needs an integer parameter 'seed', "
                f"got {seed!r}"
            )
        self.generator = torch.Generator().manual_seed(seed)

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != {"generator"}:
            raise CreditError(
                f"strategy {self.name!r}: expected state keys ['generator'], got {sorted(state)}"
            )
        self.generator.set_state(state["generator"])
