"""``CreditGRPOConfig``: TRL's ``GRPOConfig`` plus the token-credit fields.

A YAML file read by ``TrlParser`` (``--config``) sets them like any other field::

    credit: datc                       # or {name: datc, beta: 1.0, lam: 0.5}
    direction: {kind: seq_classification, path: /models/rm}
    credit_stats_chunk_size: 4096

On the command line (which overrides the YAML) ``--credit datc`` or a JSON mapping
``--credit '{"name": "datc", "beta": 2}'``. ``__post_init__`` parses the three keys into
one ``backends.common.config_values.CreditSection`` (``credit`` a ``CreditConfig``, with
its optional ``gate``; ``direction`` a ``RewardModelConfig``) and builds the run's
``CreditPlan`` on ``BACKEND`` (``backends.trl.credit``: the strategy, once per process): a
bad value or a strategy TRL cannot serve raises ``CreditError`` whose message starts with
the YAML key.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from backends.trl.version import check_trl_version

check_trl_version()  # before importing TRL: an unsupported release is refused here

from trl.trainer.grpo_config import GRPOConfig  # noqa: E402

from adapters.config import RewardModelConfig  # noqa: E402
from backends.common.config_values import CreditSection, parse_credit, parse_section  # noqa: E402
from backends.trl.credit import BACKEND  # noqa: E402
from credit_core import CreditConfig, CreditError  # noqa: E402
from credit_core.plan import CreditPlan  # noqa: E402
from credit_core.policy_stats import DEFAULT_CHUNK_SIZE  # noqa: E402

#: TRL's sampling keys (here and in ``generation_kwargs``) and their untruncated values.
SAMPLING_OFF: dict[str, tuple[object, ...]] = {
    "top_k": (0, None),
    "top_p": (1.0, None),
    "min_p": (0.0, None),
}


@dataclass
class CreditGRPOConfig(GRPOConfig):
    """``GRPOConfig`` plus ``credit``, ``direction``, ``credit_stats_chunk_size`` and the
    ``credit_samples_*`` fields (``backends.trl.credit_samples``).

    - ``credit``: the credit strategy (``credit_core``); ``uniform`` is TRL's own GRPO.
    - ``direction``: the frozen differentiable reward model whose input-embedding gradient
      strategies such as DATC read (``adapters.config.RewardModelConfig``: kinds
      ``seq_classification``, ``encoder_similarity``, ``module``). Not needed when the
      trainer is given a ``direction_model`` object, or for strategies that read no signal.
    - ``credit_stats_chunk_size``: vocabulary entries per tile of the streamed policy
      statistics (``credit_core.policy_stats``).
    """

    credit: dict[str, Any] | str | CreditConfig | None = field(
        default="uniform",
        metadata={
            "help": "Credit strategy: a name ('uniform', 'datc', ...) or a JSON mapping "
            '\'{"name": "datc", "beta": 1.0}\'. uniform is plain GRPO.'
        },
    )
    direction: dict[str, Any] | str | RewardModelConfig | None = field(
        default=None,
        metadata={
            "help": "Differentiable reward model for the reward gradient, as a JSON mapping "
            '\'{"kind": "seq_classification", "path": ...}\' (docs/reward_models.md).'
        },
    )
    credit_stats_chunk_size: int = field(
        default=DEFAULT_CHUNK_SIZE,
        metadata={"help": "Vocabulary entries per tile of the streamed policy statistics."},
    )
    credit_samples_steps: int | None = field(
        default=None,
        metadata={
            "help": "Record a few responses' token advantages to credit_samples.jsonl every N "
            "optimizer steps (and the last); default: at logging_steps; 0: off."
        },
    )
    credit_samples_count: int = field(
        default=4, metadata={"help": "Responses recorded per recorded step."}
    )
    credit_samples_compare: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Other strategies recorded for the same responses (names or JSON mappings); "
            "each must read only signals the run's strategy computes."
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()  # type: ignore[no-untyped-call]
        self.section: CreditSection = parse_section(
            self.credit, self.direction, self.credit_stats_chunk_size, gate=True
        )
        self.credit = self.section.credit
        self.direction = self.section.direction
        self.credit_samples_compare = list(self.credit_samples_compare or [])
        self.credit_samples_configs: list[CreditConfig] = [
            parse_credit(c, f"credit_samples_compare.{i}")
            for i, c in enumerate(self.credit_samples_compare)
        ]
        #: the run's credit plan on ``BACKEND``: the strategy, built once per process (the
        #: trainer's ``CreditRun`` holds it), and the signals it computes
        self.credit_plan: CreditPlan = CreditPlan.build(self.section.credit, BACKEND)
        #: (label, plan) of each compared strategy, built once
        self.compare_plans: list[tuple[str, CreditPlan]] = [
            (c.label, CreditPlan.build(c, replace(BACKEND, key=f"credit_samples_compare.{i}")))
            for i, c in enumerate(self.credit_samples_configs)
        ]
        self._check_sampling_matches_stats()
        self._check_one_entropy_selection()
        labels = [c.label for c in self.credit_samples_configs]
        if len(set(labels)) != len(labels):
            raise CreditError(f"credit_samples_compare: expected distinct strategies, got {labels}")
        for key in ("credit_samples_steps", "credit_samples_count"):
            value = getattr(self, key)
            low = 1 if key == "credit_samples_count" else 0
            if value is not None and (not isinstance(value, int) or value < low):
                raise CreditError(f"{key}: expected an integer >= {low}, got {value!r}")

    def _check_sampling_matches_stats(self) -> None:
        """A strategy whose signals reduce the distribution sampled from needs the full
        softmax at ``temperature``: ``top_k``, ``top_p`` and ``min_p`` (here or in
        ``generation_kwargs``) off (``CreditPlan.sampling_problem``)."""
        extra = self.generation_kwargs if isinstance(self.generation_kwargs, dict) else {}
        settings: dict[str, object] = {}
        for key in SAMPLING_OFF:
            settings[key] = getattr(self, key)
            settings[f"generation_kwargs.{key}"] = extra.get(key)
        problem = self.credit_plan.sampling_problem(settings, SAMPLING_OFF)
        if problem is not None:
            raise CreditError(str(problem))

    def _check_one_entropy_selection(self) -> None:
        """``credit: entropy_top`` is TRL's ``top_entropy_quantile`` as a credit strategy:
        both at once would select twice; ``CreditError`` naming the key then."""
        if self.credit_config.name == "entropy_top" and self.top_entropy_quantile < 1.0:
            raise CreditError(
                f"top_entropy_quantile: {self.top_entropy_quantile!r} applies TRL's own "
                "high-entropy mask on top of credit strategy 'entropy_top', which already "
                "selects the high-entropy tokens (its rho); leave top_entropy_quantile at 1.0"
            )

    @property
    def credit_config(self) -> CreditConfig:
        """``credit`` as the ``CreditConfig`` that ``__post_init__`` made of it."""
        return self.section.credit

    @property
    def direction_config(self) -> RewardModelConfig | None:
        """``direction`` as the ``RewardModelConfig`` that ``__post_init__`` made of it."""
        return self.section.direction

    def to_dict(self) -> dict[str, Any]:
        """TRL's ``to_dict`` with ``credit`` and ``direction`` as plain mappings (JSON-able)."""
        out: dict[str, Any] = super().to_dict()  # type: ignore[no-untyped-call]
        cfg = self.credit_config
        out["credit"] = {"name": cfg.name, **cfg.params}
        direction = self.direction_config
        out["direction"] = None if direction is None else direction.model_dump(exclude_unset=True)
        out["credit_samples_compare"] = [c.label for c in self.credit_samples_configs]
        return out
