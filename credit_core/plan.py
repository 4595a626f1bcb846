"""``CreditPlan``: what a backend computes for a run's credit strategy, built once per run.

A backend declares what it can provide (``Backend``: the signals of ``credit_core.SIGNALS``
it computes and the ``Feature``s it has) and builds one ``CreditPlan`` from the run's
validated ``CreditConfig`` at start-up. The plan builds the strategy (once), decides which
signals to compute (``signals``), says where each comes from (``sources``), and refuses a
strategy the backend cannot serve with one message format naming every missing signal or
feature (``CreditPlan.build``). The rules every backend shares are its checks, each taking
the backend's own key names for its message: the sampling truncation
(``sampling_problem``), the response-level estimator (``estimator_problem``) and the
direction model's attention and path gradient (``direction_problem``).

The reward-gradient-first rule (docs/design.md, "DATC"): a backend that knows the reward
gradient g before it reduces the policy's statistics streams DATC's unsigned work W0
(``work_requires``) instead of ``PolicyStats`` + g; a path-gradient strategy
(``reward_grad_points`` >= 1) takes g on the path to the policy's m1, which the policy pass
gives first, so it gets W0 only from a backend whose policy pass turns the statistics and
the path gradient into W0 itself (``Backend.path_work``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Literal

from credit_core.batch import (
    DIRECTION_SIGNALS,
    SIGNALS,
    SOURCES,
    TRAINED_MODEL_SIGNALS,
    Source,
)
from credit_core.config import CreditConfig
from credit_core.errors import CreditError
from credit_core.factory import get_strategy
from credit_core.strategy import CreditStrategy, CriticRewardForm
from credit_core.trained_model import ImplicitPRMSpec

#: What a strategy may read beside its signals: the response rewards and their ``groups``
#: (``reads_groups``), each response's ``answer_span`` (``reads_answer_span``), a second
#: ``trained_model`` (``implicit_prm``), the step's other processes (``gather``:
#: ``gathers``), the reward gradient on a path (``path_gradient``: ``reward_grad_points``
#: >= 1), and the token rewards the user's reward function gives (``token_rewards``:
#: ``reads_token_rewards``; a backend has it when it passes them as
#: ``CreditSignals.token_rewards``).
Feature = Literal[
    "groups", "answer_span", "trained_model", "gather", "path_gradient", "token_rewards"
]
FEATURES: frozenset[str] = frozenset(
    {"groups", "answer_span", "trained_model", "gather", "path_gradient", "token_rewards"}
)

#: The signals whose value is a reduction of the distribution the batch was sampled from.
SAMPLED_DISTRIBUTION_SIGNALS: frozenset[str] = frozenset({"policy_stats", "unsigned_work"})
#: The signals taken from the direction model's reward gradient g.
GRADIENT_SIGNALS: frozenset[str] = frozenset({"reward_grad", "unsigned_work", "reward_attribution"})

#: How a refusal names what is missing.
_DESCRIBED: Mapping[str, str] = {
    "groups": "the response rewards and their groups (CreditBatch.rewards/groups)",
    "answer_span": "each response's answer span (CreditBatch.answer_mask)",
    "trained_model": (
        "the log-probs of a second trainable model (PRIME's implicit PRM pi_phi, built from "
        "the reference policy, updated every step on the outcome labels and checkpointed "
        "with the policy; docs/backends.md, 'Strategies with a trainable model')"
    ),
    "gather": "the values of the step's other processes (CreditStrategy.gathers)",
    "path_gradient": "the reward gradient on the path to the policy's expected embeddings",
    "token_rewards": (
        "the token rewards the user's reward function gives per token or per step "
        "(CreditSignals.token_rewards)"
    ),
}


@dataclass(frozen=True)
class Problem:
    """A setting that does not fit the plan: the backend's ``key`` and the ``message``;
    ``str`` gives ``<key>: <message>``, the message every check raises."""

    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"


def signals_read(cls: type[CreditStrategy]) -> frozenset[str]:
    """Every signal strategy class ``cls`` may read: ``requires`` and ``work_requires``
    (for a check made before a backend's plan exists: a config's compared strategies)."""
    return cls.requires | (cls.work_requires or frozenset())


def sampling_problem(
    strategy: str,
    signals: frozenset[str],
    settings: Mapping[str, object],
    off: Mapping[str, Collection[object]],
) -> Problem | None:
    """A ``Problem`` at the first key of ``settings`` (the backend's sampling keys and
    their values, e.g. ``{"rollout.top_k": 50}``) whose value is not one of
    ``off[<the key's last dotted part>]``, when ``signals`` (of ``strategy``) reduce the
    distribution the batch was sampled from (``SAMPLED_DISTRIBUTION_SIGNALS``); the full
    softmax at the temperature must be what was sampled. None otherwise."""
    read = sorted(signals & SAMPLED_DISTRIBUTION_SIGNALS)
    if not read:
        return None
    for key, value in settings.items():
        short = key.rsplit(".", 1)[-1]
        if value not in off[short]:
            return Problem(
                key,
                f"{value!r} truncates the sampling distribution, but credit strategy "
                f"{strategy!r} reads the distribution actually sampled from ({read}); "
                f"leave {short} off",
            )
    return None


@dataclass(frozen=True)
class Backend:
    """What a backend provides to a credit strategy.

    - ``name``: the backend as messages name it (``TRL``, ``verl``).
    - ``key``: the config key that names the strategy (``credit``, ``algorithm.credit``,
      ``--credit``); every refusal starts with it.
    - ``signals``: the signals it computes (within ``SIGNALS``).
    - ``features``: the ``Feature``s it has.
    - ``work_first``: it knows the reward gradient before its policy pass, so it streams
      W0 for a strategy with ``work_requires``.
    - ``path_work``: its policy pass also forms W0 from the statistics and a path gradient
      (``reward_grad_points`` >= 1; otherwise such a strategy gets ``requires``).
    - ``hint`` (keyword, required): what serves a strategy it refuses, in the backend's own
      words (ends the refusal); the core names no backend.
    """

    name: str
    key: str
    signals: frozenset[str]
    features: frozenset[str]
    work_first: bool = True
    path_work: bool = False
    hint: str = field(kw_only=True)

    def __post_init__(self) -> None:
        if not self.signals <= SIGNALS:
            raise CreditError(
                f"Backend {self.name!r}: signals must be within {sorted(SIGNALS)}, "
                f"got {sorted(self.signals - SIGNALS)}"
            )
        if not self.features <= FEATURES:
            raise CreditError(
                f"Backend {self.name!r}: features must be within {sorted(FEATURES)}, "
                f"got {sorted(self.features - FEATURES)}"
            )


@dataclass(frozen=True)
class CreditPlan:
    """One run's credit strategy, bound to the backend that serves it.

    - ``strategy``: the strategy instance (built once: ``build``).
    - ``signals``: the signals the backend computes (the strategy's ``signals_to_compute``
      under the reward-gradient-first rule); ``assign_credit`` refuses any other.
    - ``reward_grad_first``: whether the reward gradient precedes the policy pass (W0
      streamed); False for a path-gradient strategy on a backend without ``path_work``.
    - ``backend``: the ``Backend`` it was checked against.
    - ``gate_signals``: the signals within ``signals`` that only the credit's gate reads
      (``GateConfig.signals`` less the strategy's own); the backend computes them and the
      run takes them out before ``assign_credit`` (``backends.common.credit.CreditRun``).
    """

    strategy: CreditStrategy
    signals: frozenset[str]
    reward_grad_first: bool
    backend: Backend
    gate_signals: frozenset[str] = frozenset()

    @classmethod
    def build(
        cls,
        credit: CreditConfig | str | CreditStrategy,
        backend: Backend,
        *,
        work_first: bool | None = None,
    ) -> CreditPlan:
        """The plan of ``credit`` (a validated config, a name, or a strategy already built)
        on ``backend``; ``work_first`` overrides ``backend.work_first`` for this run (a
        backend whose placement decides it). ``CreditError`` starting with ``backend.key``
        and naming every signal or feature the strategy reads and the backend lacks."""
        plan = cls.unchecked(credit, backend, work_first=work_first)
        missing = plan.missing(backend)
        if missing:
            raise CreditError(plan.refusal(missing))
        return plan

    @classmethod
    def unchecked(
        cls,
        credit: CreditConfig | str | CreditStrategy,
        backend: Backend,
        *,
        work_first: bool | None = None,
    ) -> CreditPlan:
        """``build`` without the refusal (what a backend would compute; ``missing`` says
        what it lacks)."""
        strategy = credit if isinstance(credit, CreditStrategy) else get_strategy(credit)
        first = backend.work_first if work_first is None else work_first
        path = bool(strategy.reward_grad_points)
        grad_first = first and (not path or backend.path_work)
        signals = type(strategy).signals_to_compute(reward_grad_first=grad_first)
        gate = credit.gate if isinstance(credit, CreditConfig) else None
        gate_signals = (gate.signals - signals) if gate is not None else frozenset()
        return cls(strategy, signals | gate_signals, grad_first, backend, gate_signals)

    # ------------------------------------------------------------------ what it reads

    @property
    def name(self) -> str:
        """The strategy's registry name."""
        return self.strategy.name

    @property
    def reward_grad_points(self) -> int:
        """Where the reward gradient is taken: 0 at the samples, n >= 1 on n path points."""
        return self.strategy.reward_grad_points

    @property
    def path(self) -> bool:
        """Whether the reward gradient is taken on the path (``reward_grad_points`` >= 1)."""
        return bool(self.strategy.reward_grad_points)

    @property
    def gathers(self) -> bool:
        """Whether ``assign`` reaches the step's other processes (a batch-wide gather)."""
        return type(self.strategy).gathers

    @property
    def reads_groups(self) -> bool:
        """Whether the backend passes the response rewards and groups."""
        return self.strategy.reads_groups

    @property
    def reads_answer_span(self) -> bool:
        """Whether the backend passes each response's answer span."""
        return type(self.strategy).reads_answer_span

    @property
    def reads_token_rewards(self) -> bool:
        """Whether the backend passes the token rewards of the user's reward function."""
        return type(self.strategy).reads_token_rewards

    @property
    def trained_model(self) -> ImplicitPRMSpec | None:
        """How to host the second trainable model the strategy reads (PRIME), or None."""
        return self.strategy.implicit_prm if self.signals & TRAINED_MODEL_SIGNALS else None

    @property
    def sources(self) -> dict[str, Source]:
        """Each computed signal and where it comes from (``SOURCES``)."""
        return {s: SOURCES[s] for s in sorted(self.signals)}

    def from_source(self, source: Source) -> frozenset[str]:
        """The computed signals that come from ``source``."""
        return frozenset(s for s in self.signals if SOURCES[s] == source)

    @property
    def needs_direction(self) -> bool:
        """Whether a direction model is needed (a signal of ``DIRECTION_SIGNALS``)."""
        return bool(self.signals & DIRECTION_SIGNALS)

    @property
    def needs_reward_grad(self) -> bool:
        """Whether the direction model's reward gradient is taken (``GRADIENT_SIGNALS``)."""
        return bool(self.signals & GRADIENT_SIGNALS)

    @property
    def reads_sampled_distribution(self) -> bool:
        """Whether a signal reduces the distribution the batch was sampled from."""
        return bool(self.signals & SAMPLED_DISTRIBUTION_SIGNALS)

    @property
    def features(self) -> frozenset[str]:
        """The ``Feature``s the strategy reads."""
        found = {
            "groups": self.reads_groups,
            "answer_span": self.reads_answer_span,
            "trained_model": bool(self.signals & TRAINED_MODEL_SIGNALS),
            "gather": self.gathers,
            "path_gradient": self.path,
            "token_rewards": self.reads_token_rewards,
        }
        return frozenset(f for f, on in found.items() if on)

    # ------------------------------------------------------------------ the checks

    def missing(self, backend: Backend) -> list[str]:
        """The signals and features the strategy reads that ``backend`` lacks, sorted."""
        return sorted((self.signals - backend.signals) | (self.features - backend.features))

    def refusal(self, missing: Collection[str]) -> str:
        """The one refusal message: ``<key>: strategy <name> is not served: it reads
        <missing> ...``, each feature described."""
        signals = sorted(m for m in missing if m in SIGNALS)
        parts = [str(signals)] if signals else []
        parts += [_DESCRIBED[m] for m in sorted(missing) if m in FEATURES]
        b = self.backend
        return (
            f"{b.key}: strategy {self.name!r} is not served: it reads {' and '.join(parts)}, "
            f"which the {b.name} backend does not provide (it provides the signals "
            f"{sorted(b.signals)} and the features {sorted(b.features)}); {b.hint}"
        )

    def sampling_problem(
        self, settings: Mapping[str, object], off: Mapping[str, Collection[object]]
    ) -> Problem | None:
        """``sampling_problem`` of this plan's strategy and signals."""
        return sampling_problem(self.name, self.signals, settings, off)

    def estimator_problem(
        self,
        key: str,
        estimator: object,
        allowed: Collection[str],
        critic: Collection[str] = (),
    ) -> Problem | None:
        """``estimator_problem`` of this plan's strategy."""
        return estimator_problem(
            self.name, self.strategy.critic_reward_form, key, estimator, allowed, critic
        )

    def direction_problem(
        self, key: str, model: str, *, gives_attention: bool, path_problem: str | None
    ) -> Problem | None:
        """A ``Problem`` at ``key`` when the direction model built for the run (``model`` names it)
        cannot give what the strategy reads: its attention (``gives_attention``), or the
        path gradient (``path_problem``: ``adapters.grad_path.path_problem`` of the model,
        None when it can); None otherwise."""
        if self.path and path_problem is not None:
            return Problem(
                key,
                f"strategy {self.name!r} takes the reward gradient on the path "
                f"to the policy's expected embeddings, but {model} cannot: "
                f"{path_problem}; use a direction model that reads the policy's token ids",
            )
        if "reward_attention" in self.signals and not gives_attention:
            return Problem(
                key,
                f"strategy {self.name!r} reads the direction model's attention "
                f"(reward_attention), but {model} gives none "
                "(gives_attention is False); use a transformer reward model "
                "(seq_classification or encoder_similarity)",
            )
        return None


def config_critic_form(credit: CreditConfig) -> CriticRewardForm | None:
    """``CreditStrategy.critic_form`` of a credit setting, from its class and validated
    parameters, without building the strategy (a config check builds none: one instance per
    process, the run's)."""
    from credit_core.registry import strategy_class, validate_params

    return strategy_class(credit.name).critic_form(validate_params(credit.name, credit.params))


def estimator_problem(
    name: str,
    form: CriticRewardForm | None,
    key: str,
    estimator: object,
    allowed: Collection[str],
    critic: Collection[str] = (),
) -> Problem | None:
    """A ``Problem`` at ``key`` when ``estimator`` is neither one of ``allowed`` (the
    backend's response-level estimators: a strategy other than ``uniform`` splits one
    advantage per response over its tokens) nor one of ``critic`` (the backend's critic
    estimators, served by ``critic_reward_shift`` for strategy ``name`` when its critic
    ``form`` is not None). None for ``uniform`` (it serves any estimator)."""
    if name == "uniform" or estimator in allowed:
        return None
    if estimator in critic:
        if form is not None:
            return None
        return Problem(
            key,
            f"{estimator!r}; credit strategy {name!r} has no token-reward form for a "
            "critic (its token advantages are no redistribution of the response reward, "
            "docs/design.md, 'Credit under a critic'): use one of "
            f"{sorted(allowed)}",
        )
    return Problem(
        key,
        f"{estimator!r}; credit strategy {name!r} splits a response-level advantage "
        f"over its tokens: use one of {sorted([*allowed, *critic])}",
    )
