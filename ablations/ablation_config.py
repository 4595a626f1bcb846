"""The ablation config: which settings, families, seeds and strategies, and how to train.

A YAML mapping validated by ``AblateConfig`` (unknown keys are errors naming the key);
``--set key=value`` overrides use the trainer's syntax (``backends.torch.config``). Every
run's trainer config is ``train`` (shared), then the setting's built-in defaults, then the
setting's own ``train`` overrides, then the run's own fields (seed, credit, policy, data,
reward, output folder); it is validated by the trainer's ``TrainConfig``.

``strategies`` entries are what ``credit:`` accepts (``datc`` or ``{name: datc, beta: 2}``)
plus an optional ``label`` naming the run (default: the strategy name; labels are unique)
and an optional ``settings`` list: the settings the strategy runs in (default: all; e.g.
the path gradient of ``datc_mid`` and ``datc_ig`` needs a reward model that reads the
policy's token ids, not the vocabulary bridge of ``minilm_bridge``), and an optional
``train``: trainer overrides of that row's runs, applied after the setting's. PPO with a
critic is such a row, at the same rollout budget (prompts_per_step x group_size samples per
step, group_size unchanged) as every other row::

    - {label: ppo_gae, name: uniform, train: {algorithm: {estimator: gae}}}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator, model_validator

from ablations.credit_probes import ProbeConfig
from ablations.sample_fidelity import AXES
from ablations.settings import SETTINGS, SettingKind, seeded
from ablations.summary import MIN_PAIRS, PrimaryFamily
from adapters.tiny import Family
from backends.common.errors import ConfigError, FieldError, format_config_errors
from backends.torch.config import (
    Section,
    apply_overrides,
    config_from_dict,
    parse_override,
    read_yaml_config,
    yaml_key_lines,
)
from credit_core import CreditConfig, errors
from credit_core.errors import FieldProblem, validation_messages

#: How an unknown key of an ablation config is reported (the trainer's says "unknown key").
UNKNOWN_KEY = "Extra inputs are not permitted: unknown key"
#: Trainer keys that the runner sets per run; a ``train`` section may not set them.
RUN_OWNED_KEYS = frozenset({"seed", "credit", "policy", "reward", "output_dir"})


class StrategyConfig(Section):
    """One strategy of the comparison: its label, its ``CreditConfig`` and the settings it
    runs in."""

    label: str
    credit: CreditConfig
    settings: list[str] | None = Field(
        default=None, description="the settings this strategy runs in; null: all"
    )
    train: dict[str, Any] = Field(
        default_factory=dict,
        description="trainer overrides of this strategy's runs (after the setting's), e.g. "
        "{algorithm: {estimator: gae}} for PPO with a critic",
    )

    def runs_in(self, setting: str) -> bool:
        return self.settings is None or setting in self.settings

    @classmethod
    def parse(cls, value: Any) -> StrategyConfig:
        if isinstance(value, StrategyConfig):
            return value
        if isinstance(value, str):
            return cls(label=value, credit=CreditConfig.parse(value))
        if isinstance(value, Mapping):
            own = ("label", "settings", "train")
            credit = CreditConfig.parse({k: v for k, v in value.items() if k not in own})
            return cls(
                label=str(value.get("label", credit.name)),
                credit=credit,
                settings=value.get("settings"),
                train=value.get("train") or {},
            )
        raise ValueError(f"expected a strategy name or mapping, got {type(value).__name__}")


class SettingConfig(Section):
    """One built-in setting with its parameters and training overrides. ``kind`` names the
    built-in setting it is an instance of (default: the setting's own name), so that one kind
    can run under several names with different params (``sweep_24``, ``sweep_192`` of kind
    ``length_sweep``)."""

    kind: str | None = Field(
        default=None, description="the built-in setting this is one of; null: its own name"
    )
    params: dict[str, Any] = Field(default_factory=dict, description="the setting's params")
    train: dict[str, Any] = Field(default_factory=dict, description="trainer overrides")
    threshold: float | None = Field(
        default=None,
        description="train reward for 'steps to threshold'; null = automatic (report.py)",
    )
    primary: str | None = Field(
        default=None,
        description="the held-out metric (a results.csv column the setting records) that the "
        "verdicts judge, named before the runs; null = the setting's default (settings.py)",
    )


class PrimaryFamilyConfig(Section):
    """A report's pre-registered primary family (docs/design.md, "Evaluation"), named before
    the runs: its contrasts are judged by the exact paired sign-flip test, Holm-corrected over
    the family; every other contrast of the report is secondary (no verdict)."""

    against_baseline: list[str] = Field(
        default_factory=list,
        description="labels each judged against GRPO's row (the baseline, or the best of "
        "baseline_best_of) in every setting where they ran",
    )
    pairs: list[tuple[str, str]] = Field(
        default_factory=list,
        description="[contender, against] labels judged in every setting where both ran, "
        "e.g. [datc_mid, p2t_matched]",
    )
    baseline_best_of: list[str] = Field(
        default_factory=list,
        description="GRPO at several learning rates: GRPO's row is, per setting, the one of "
        "these labels with the highest mean primary metric over all its (family, seed) pairs; "
        "empty: the config's baseline",
    )

    def spec(self) -> PrimaryFamily:
        """The family as the report's ``SummarySpec`` holds it."""
        return PrimaryFamily(
            tuple(self.against_baseline),
            tuple((a, b) for a, b in self.pairs),
            tuple(self.baseline_best_of),
        )


class SweepConfig(Section):
    """A declared sweep (``sweeps.measured_sweep``): settings of one kind, judged on one
    metric, that differ in their direction models, put side by side against a measured
    figure of those models on the step-0 policy's own samples."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9_-]+$",
        description="the sweep's name in the report and its figure's file (sweep_<name>.png)",
    )
    settings: list[str] = Field(
        min_length=2, description="two or more settings of this config, of one kind"
    )
    axis: str = Field(
        description="the measured figure (info.policy_samples, mean over each setting's "
        "(policy, RM) pairs) the settings are ordered by: rm_corr or rm_pair_accuracy"
    )

    @field_validator("axis")
    @classmethod
    def _axis(cls, value: str) -> str:
        if value not in AXES:
            raise ValueError(f"expected one of {sorted(AXES)}, got {value!r}")
        return value


class GateCriteriaConfig(Section):
    """A gate's two pre-registered criteria (``gate_criteria``; docs/design.md, "Trusting
    the direction model"), named before the runs: where the direction model is weak the
    gated strategy is no worse than GRPO (its paired interval's lower bound above
    ``floor``); where it is good the gated strategy keeps at least ``keep`` of the ungated
    strategy's gain over GRPO."""

    gated: str = Field(description="label of the gated strategy, e.g. datc_gated")
    ungated: str = Field(description="label of the same strategy without the gate, e.g. datc")
    weak: list[str] = Field(
        min_length=1, description="settings whose direction model is weak (the floor criterion)"
    )
    floor: float = Field(
        lt=0.0, description="the lower bound of gated - GRPO that the weak settings must beat"
    )
    good: list[str] = Field(
        min_length=1, description="settings whose direction model is good (the keep criterion)"
    )
    keep: float = Field(
        gt=0.0, le=1.0, description="the fraction of the ungated gain over GRPO to keep"
    )


class ReportConfig(Section):
    """How runs are summarized."""

    final_window: int = Field(
        default=5, ge=1, description="final train reward: mean of the last N steps"
    )
    smooth: int = Field(default=5, ge=1, description="moving average before the threshold test")
    confidence: float = Field(default=0.95, gt=0.0, lt=1.0)
    heatmap_responses: int = Field(default=4, ge=1, description="responses in the credit heat-map")
    min_pairs: int = Field(
        default=MIN_PAIRS,
        ge=2,
        description="fewest (family, seed) pairs a verdict is given from; below it the report "
        "shows the numbers and says 'too few pairs'",
    )
    contenders: list[str] = Field(
        default_factory=list,
        description="labels compared head to head with each of 'published' (e.g. datc, datc_mid)",
    )
    published: list[str] = Field(
        default_factory=list,
        description="labels of the published token-credit baselines the contenders face",
    )
    reference: str | None = Field(
        default=None,
        description="strongest_baselines.json of a reference report (e.g. docs/results/full/"
        "strongest_baselines.json): the report names the reference's strongest baseline of a "
        "setting where it did not run here",
    )
    primary_family: PrimaryFamilyConfig | None = Field(
        default=None,
        description="the pre-registered primary family (its verdicts: exact sign-flip test, "
        "Holm over the family; the rest is secondary); null: every contrast is decided by the "
        "paired t-test, Holm-corrected per setting",
    )
    gate_criteria: GateCriteriaConfig | None = Field(
        default=None,
        description="a gate's pre-registered criteria (judged against the config's baseline); "
        "null: none",
    )
    sweeps: list[SweepConfig] = Field(
        default_factory=list,
        description="declared sweeps over a measured figure of the direction models, e.g. "
        "{name: fidelity_length, settings: [sweep_96, proxy_05], axis: rm_corr}",
    )


class AblateConfig(Section):
    """The whole ablation; see configs/ablate/*.yaml."""

    name: str = "ablation"
    output_dir: str = "runs/ablate"
    cache_dir: str = Field(default=".cache/ablate", description="pretrained policies, RMs, data")
    banked: list[str] = Field(
        default_factory=list,
        description="folders of runs finished elsewhere (``ablations.bank``, committed beside "
        "the reports): the runner takes those made with this config (the same fingerprint) as "
        "its own, and `python -m ablations bank CONFIG` adds the output folder's finished runs "
        "to the first. Not part of any run's fingerprint",
    )
    families: list[Family] = Field(default_factory=lambda: list[Family](["llama"]), min_length=1)
    seeds: list[int] = Field(default_factory=lambda: [0, 1], min_length=1)
    model_seeds: bool = Field(
        default=False,
        description="a run's seed also sets its policy's pretraining and its reward model's "
        "training (settings.seeded: one pretrained policy and RM per seed, so the pairs hold "
        "model variance); false: one per (setting, family), shared by every seed",
    )
    strategies: list[StrategyConfig] = Field(min_length=1)
    baseline: str = Field(
        default="uniform", description="label of the strategy differences refer to"
    )
    method: str | None = Field(
        default=None,
        description="label of the strategy under test (the verdicts); null = the first "
        "strategy that is not the baseline",
    )
    control: str | None = Field(
        default=None, description="label of the control the method is also compared with"
    )
    settings: dict[str, SettingConfig] = Field(min_length=1)
    train: dict[str, Any] = Field(default_factory=dict, description="trainer config, all runs")
    threads: int = Field(
        default=1, ge=1, description="torch intra-op threads (tiny models: 1 is fastest)"
    )
    workers: int = Field(
        default=1, ge=1, description="worker processes (each runs a shard of the plan, then merge)"
    )
    worker_timeout_s: float = Field(
        default=1800.0,
        gt=0,
        description="a worker that shows no progress (no new metrics line, no new run or "
        "asset) for this long is taken as hung: it is killed and the runner stops, naming it",
    )
    report: ReportConfig = Field(default_factory=ReportConfig)
    probes: ProbeConfig = Field(default_factory=ProbeConfig)
    only: list[str] | None = Field(
        default=None,
        description="train only the runs of these strategy labels now (no report: merge the "
        "rest with `merge --from` / `--rows`); null = the whole plan. Not part of any run's "
        "fingerprint",
    )

    @field_validator("strategies", mode="before")
    @classmethod
    def _strategies(cls, value: Any) -> Any:
        if not isinstance(value, list):
            raise ValueError("expected a list of strategies")
        return [StrategyConfig.parse(v) for v in value]

    @field_validator("settings", mode="before")
    @classmethod
    def _settings(cls, value: Any) -> Any:
        if isinstance(value, list):  # [target_tokens, verifiable] = all defaults
            value = {name: {} for name in value}
        if not isinstance(value, Mapping):
            raise ValueError("expected a mapping (or a list) of setting names")
        value = {k: ({} if v is None else v) for k, v in value.items()}
        kinds = {
            k: str(v.get("kind") or k) if isinstance(v, Mapping) else k for k, v in value.items()
        }
        unknown = sorted({kind for kind in kinds.values() if kind not in SETTINGS})
        if unknown:
            raise ValueError(
                f"unknown settings {unknown}; built-in: {list(SETTINGS)} (a setting under "
                "another name gives its built-in one as 'kind')"
            )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> AblateConfig:
        sections = [("train", self.train)]
        sections += [(f"settings.{n}.train", s.train) for n, s in self.settings.items()]
        sections += [(f"strategies.{s.label}.train", s.train) for s in self.strategies]
        for where, section in sections:
            owned = sorted(set(section) & RUN_OWNED_KEYS)
            if owned:
                raise ValueError(
                    f"{where}: {owned} are set by the runner for each run (seeds, strategies, "
                    "the setting's policy and reward); remove them"
                )
        labels = [s.label for s in self.strategies]
        dupes = sorted({x for x in labels if labels.count(x) > 1})
        if dupes:
            raise ValueError(f"strategies: duplicate labels {dupes}; give each a 'label'")
        unknown_compare = sorted(set(self.probes.compare) - set(labels))
        if unknown_compare:
            raise ValueError(
                f"probes.compare: {unknown_compare} are not labels of the strategies {labels}"
            )
        trained = sorted(x for x in self.probes.compare if self.strategy(x).train)
        if trained:
            raise ValueError(
                f"probes.compare: {trained} have their own trainer overrides ('train'), which a "
                "credit judged on another run's batches cannot carry; compare credit strategies"
            )
        for strategy in self.strategies:
            unknown = sorted(set(strategy.settings or []) - set(self.settings))
            if unknown:
                raise ValueError(
                    f"strategies: {strategy.label!r} names settings {unknown} that are not "
                    f"in this config's settings {list(self.settings)}"
                )
            core = strategy.label in (self.baseline, self.method_label)
            if core and strategy.settings is not None:
                raise ValueError(
                    f"strategies: the baseline and the method run in every setting; remove "
                    f"'settings' from {strategy.label!r}"
                )
        unknown_only = sorted(set(self.only or []) - set(labels))
        if unknown_only:
            raise ValueError(f"only: {unknown_only} are not labels of the strategies {labels}")
        for role in ("contenders", "published"):
            unknown_labels = sorted(set(getattr(self.report, role)) - set(labels))
            if unknown_labels:
                raise ValueError(
                    f"report.{role}: {unknown_labels} are not labels of the strategies {labels}"
                )
        for role in ("baseline", "method", "control"):
            label = getattr(self, role)
            if label is not None and label not in labels:
                raise ValueError(f"{role}: {label!r} is not one of the strategies {labels}")
        if self.report.primary_family is not None:
            self._check_primary_family(self.report.primary_family)
        self._check_sweeps()
        if self.report.gate_criteria is not None:
            self._check_gate_criteria(self.report.gate_criteria)
        for name, spec in self.settings.items():
            recorded = self.setting_kind(name).metrics()
            if spec.primary is not None and spec.primary not in recorded:
                raise FieldError(
                    f"settings.{name}.primary",
                    f"{spec.primary!r} is not a held-out metric setting {name!r} records; "
                    f"expected one of {sorted(recorded)}",
                )
            greedy = deep_merge(self.train, spec.train).get("eval", {}).get("greedy", True)
            if self.primary(name) == "eval_reward_greedy" and greedy is False:
                raise FieldError(
                    f"settings.{name}.primary",
                    "'eval_reward_greedy' is recorded only with train.eval.greedy: true",
                )
            model = self.setting_kind(name).params
            try:
                model.model_validate(spec.params)
            except ValidationError as exc:
                raise _params_error(name, validation_messages(exc, model)) from None
        if len(set(self.seeds)) != len(self.seeds) or len(set(self.families)) != len(self.families):
            raise ValueError("seeds and families must not repeat")
        return self

    def _check_primary_family(self, family: PrimaryFamilyConfig) -> None:
        """Every label of the primary family a strategy's, GRPO's candidates run in every
        setting, each contrast declared once and able to run somewhere; else a
        ``FieldError`` naming the key."""
        where = "report.primary_family"
        labels = [s.label for s in self.strategies]

        def known(key: str, named: Sequence[str]) -> None:
            unknown = sorted(set(named) - set(labels))
            if unknown:
                raise FieldError(
                    f"{where}.{key}", f"{unknown} are not labels of the strategies {labels}"
                )

        if not family.against_baseline and not family.pairs:
            raise FieldError(where, "declare at least one contrast (against_baseline or pairs)")
        known("against_baseline", family.against_baseline)
        known("baseline_best_of", family.baseline_best_of)
        grpo = family.baseline_best_of or [self.baseline]
        if family.baseline_best_of:
            if len(set(grpo)) < 2 or len(set(grpo)) != len(grpo):
                raise FieldError(
                    f"{where}.baseline_best_of",
                    f"expected two or more distinct labels to pick GRPO's row from, got {grpo}",
                )
            partial = [x for x in grpo if self.strategy(x).settings is not None]
            if partial:
                raise FieldError(
                    f"{where}.baseline_best_of",
                    f"{partial} run only in some settings; GRPO's candidates run in every "
                    "setting (remove their 'settings')",
                )
        repeated = sorted(
            {x for x in family.against_baseline if family.against_baseline.count(x) > 1}
        )
        if repeated:
            raise FieldError(f"{where}.against_baseline", f"{repeated} are named twice")
        own = sorted(set(family.against_baseline) & set(grpo))
        if own:
            raise FieldError(
                f"{where}.against_baseline",
                f"{own} are GRPO's row ({grpo}) and cannot be judged against it",
            )
        seen: set[frozenset[str]] = set()
        for i, (contender, against) in enumerate(family.pairs):
            key = f"pairs.{i}"
            known(key, [contender, against])
            if contender == against or frozenset((contender, against)) in seen:
                raise FieldError(
                    f"{where}.{key}",
                    f"[{contender}, {against}]: expected two different labels, each pair once",
                )
            seen.add(frozenset((contender, against)))
            a, b = self.strategy(contender), self.strategy(against)
            if not any(a.runs_in(n) and b.runs_in(n) for n in self.settings):
                raise FieldError(
                    f"{where}.{key}", f"[{contender}, {against}]: no setting runs both"
                )

    def _check_gate_criteria(self, gate: GateCriteriaConfig) -> None:
        """Both labels strategies of this config that run in every named setting, the
        settings this config's; else a ``FieldError`` naming the key."""
        where = "report.gate_criteria"
        labels = [s.label for s in self.strategies]
        for key in ("gated", "ungated"):
            label = getattr(gate, key)
            if label not in labels:
                raise FieldError(
                    f"{where}.{key}", f"{label!r} is not one of the strategies {labels}"
                )
        if gate.gated == gate.ungated:
            raise FieldError(f"{where}.ungated", "expected another label than 'gated'")
        for key in ("weak", "good"):
            named: list[str] = getattr(gate, key)
            unknown = [n for n in named if n not in self.settings]
            if unknown:
                raise FieldError(
                    f"{where}.{key}",
                    f"{unknown} are not settings of this config {list(self.settings)}",
                )
            for label in (gate.gated, gate.ungated, self.baseline):
                missing = [n for n in named if not self.strategy(label).runs_in(n)]
                if missing:
                    raise FieldError(f"{where}.{key}", f"{label!r} does not run in {missing}")

    def _check_sweeps(self) -> None:
        """Each declared sweep's name once and no setting kind's (the automatic sweeps' file
        names), its settings this config's, distinct, of one kind and judged on one metric;
        else a ``FieldError`` naming the key."""
        kinds = {n: self.settings[n].kind or n for n in self.settings}
        names: set[str] = set()
        for i, sweep in enumerate(self.report.sweeps):
            where = f"report.sweeps.{i}"
            if sweep.name in names or sweep.name in kinds.values():
                raise FieldError(
                    f"{where}.name",
                    f"{sweep.name!r} is another sweep's or a setting kind's name; name each "
                    "declared sweep apart",
                )
            names.add(sweep.name)
            unknown = [n for n in sweep.settings if n not in self.settings]
            if unknown:
                raise FieldError(
                    f"{where}.settings",
                    f"{unknown} are not settings of this config {list(self.settings)}",
                )
            if len(set(sweep.settings)) != len(sweep.settings):
                raise FieldError(f"{where}.settings", f"{sweep.settings} names a setting twice")
            of_kind = sorted({kinds[n] for n in sweep.settings})
            if len(of_kind) > 1:
                raise FieldError(
                    f"{where}.settings", f"expected settings of one kind, got kinds {of_kind}"
                )
            metrics = sorted({self.primary(n) for n in sweep.settings})
            if len(metrics) > 1:
                raise FieldError(
                    f"{where}.settings",
                    f"expected settings judged on one primary metric, got {metrics}",
                )

    def setting_kind(self, name: str) -> SettingKind:
        """The built-in setting that setting ``name`` is one of (its ``kind``, or its name)."""
        return SETTINGS[self.settings[name].kind or name]

    def setting_params(self, name: str, seed: int | None = None) -> Any:
        """The validated parameter model of setting ``name``; with ``model_seeds`` and a
        run's ``seed``, its pretraining and reward-model seeds set by it (``seeded``)."""
        params = self.setting_kind(name).params.model_validate(self.settings[name].params)
        if self.model_seeds and seed is not None:
            return seeded(params, seed)
        return params

    def setting_title(self, name: str) -> str:
        """The report title of setting ``name``: its kind's, formatted with its params, and
        followed by `` (name)`` where another setting of this config formats to the same
        title (settings that differ only in a parameter the title does not show, such as the
        direction model's)."""
        title = self._kind_title(name)
        if any(other != name and self._kind_title(other) == title for other in self.settings):
            return f"{title} ({name})"
        return title

    def _kind_title(self, name: str) -> str:
        return self.setting_kind(name).title.format(**self.setting_params(name).model_dump())

    def primary(self, name: str) -> str:
        """Setting ``name``'s primary held-out metric: its ``primary``, or the default."""
        return self.settings[name].primary or self.setting_kind(name).primary

    def primary_label(self, name: str) -> str:
        """What setting ``name``'s primary metric measures."""
        return self.setting_kind(name).metrics()[self.primary(name)]

    @property
    def method_label(self) -> str:
        """The strategy under test: ``method``, or the first strategy but the baseline."""
        if self.method is not None:
            return self.method
        others = [s.label for s in self.strategies if s.label != self.baseline]
        return others[0] if others else self.baseline

    def strategy(self, label: str) -> StrategyConfig:
        return next(s for s in self.strategies if s.label == label)

    def to_yaml_dict(self) -> dict[str, Any]:
        """The config as YAML input (``load_ablate_config`` reads it back to an equal one)."""
        data = self.model_dump(mode="json")
        data["strategies"] = [
            {
                "label": s.label,
                **s.credit.model_dump(mode="json"),  # name, gate and every parameter
                **({} if s.settings is None else {"settings": list(s.settings)}),
                **({"train": s.train} if s.train else {}),
            }
            for s in self.strategies
        ]
        return data


def _params_error(setting: str, problems: list[FieldProblem]) -> FieldError:
    """The first problem of setting ``setting``'s params, blamed on its key, the others
    appended."""
    first, *others = problems
    message = first.message
    if first.kind == "unknown":
        message = UNKNOWN_KEY + message.removeprefix(errors.UNKNOWN_KEY)
    if others:
        message += "; also " + "; ".join(f"params.{p}" for p in others)
    return FieldError(".".join(filter(None, ["settings", setting, "params", first.field])), message)


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` merged in, mappings recursively, everything else replaced."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def load_ablate_config(path: str | Path, overrides: Sequence[str] = ()) -> AblateConfig:
    """Read, override (``--set``) and validate an ablation config; ``ConfigError`` if bad.

    The shared ``train`` section is checked against the trainer's config right away (with a
    stand-in policy and task), so a typo fails before anything is built.
    """
    file = Path(path)
    raw, text = read_yaml_config(file)
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{file}: expected a mapping at the top level")
    merged = apply_overrides(raw, overrides)
    try:
        cfg = AblateConfig.model_validate(merged)
    except ValidationError as exc:
        overridden = {tuple(parse_override(t)[0]): t for t in overrides}
        message = format_config_errors(
            exc,
            AblateConfig,
            str(file),
            yaml_key_lines(text),
            overridden,
            what="ablation config",
            unknown_key=UNKNOWN_KEY,
        )
        raise ConfigError(message) from None
    for name, spec in cfg.settings.items():
        stand_in = deep_merge(
            deep_merge(cfg.train, spec.train),
            {"policy": {"preset": {"family": "llama"}}, "data": {"task": "positional"}},
        )
        config_from_dict(stand_in, source=f"{file} (train + settings.{name}.train)")
        for strategy in (s for s in cfg.strategies if s.train and s.runs_in(name)):
            config_from_dict(
                deep_merge(
                    deep_merge(stand_in, strategy.train),
                    {"credit": strategy.credit.model_dump()},
                ),
                source=f"{file} (settings.{name} + strategies.{strategy.label}.train)",
            )
    return cfg
