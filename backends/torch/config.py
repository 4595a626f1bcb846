"""The trainer's configuration: pydantic models, YAML loading, ``--set`` overrides.

A config is one YAML mapping validated by ``TrainConfig``; every section forbids unknown keys.
``load_config`` turns every validation failure into one ``ConfigError`` whose lines name the
dotted key, where it came from (``file.yaml:LINE`` or the ``--set`` argument) and what was
expected. ``credit`` is exactly ``credit_core.CreditConfig``: ``credit: datc`` and
``credit: {name: datc, beta: 2.0}`` both work.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from adapters.config import RewardSignalsConfig
from adapters.gguf import GGUFError, GGUFSpec
from adapters.tiny import Family
from backends.common.data import check_shardable
from backends.common.errors import ConfigError, FieldError, format_config_errors
from backends.common.tasks import task_problems
from credit_core import ESTIMATORS, SIGNALS, CreditConfig, CreditError, strategy_class
from credit_core.plan import (
    FEATURES,
    Backend,
    config_critic_form,
    estimator_problem,
    sampling_problem,
    signals_read,
)

LossAgg = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
KLEstimator = Literal["k1", "k2", "k3"]

#: What the native trainer provides: every signal and feature (docs/backends.md). Its rewards
#: are scored before the old policy's pass (W0 streamed), except on a path, whose gradient
#: needs that pass's m1 first.
BACKEND = Backend(
    "native",
    "credit",
    SIGNALS,
    FEATURES,
    work_first=True,
    path_work=False,
    hint="every signal and feature of credit_core is computed here (docs/backends.md)",
)
#: The values of the rollout's sampling keys that leave the distribution untruncated.
SAMPLING_OFF: dict[str, tuple[object, ...]] = {"top_k": (0,), "top_p": (1.0,)}


class Section(BaseModel):
    """Base of every config section (trainer and ablation): unknown keys are errors, and a
    validated config is immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class PresetConfig(Section):
    """A built-in tiny policy (random init, built from a config, no download)."""

    family: Family = "llama"
    size: Literal["tiny", "small"] = Field(
        default="tiny", description="a shape of adapters.tiny.SIZES"
    )
    vocab_size: int = Field(
        default=512, ge=300, description="size of the in-process byte-level BPE"
    )
    seed: int | None = Field(default=None, description="weight-init seed; default: the run's seed")


class PolicyConfig(Section):
    """The policy: a local Hugging Face model folder, a GGUF file (``adapters.gguf``: by
    path, or by the package that ships it) or a built-in tiny preset."""

    path: str | None = Field(default=None, description="local folder with config.json and weights")
    gguf: GGUFSpec | None = Field(
        default=None, description="a GGUF file: {path: ...} or {package: ..., file: ...}"
    )
    preset: PresetConfig | None = None
    tokenizer: str | None = Field(
        default=None, description="tokenizer folder; default: the model's"
    )
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    gradient_checkpointing: bool = False

    @model_validator(mode="after")
    def _one_source(self) -> PolicyConfig:
        if sum(source is not None for source in (self.path, self.gguf, self.preset)) != 1:
            raise ValueError(
                "set exactly one of 'path' (a local model folder), 'gguf' (a GGUF file) or 'preset'"
            )
        if self.path is not None:
            folder = Path(self.path).expanduser()
            if not (folder / "config.json").is_file():
                raise FieldError(
                    "path",
                    f"no Hugging Face model folder at {str(folder)!r} "
                    "(expected a directory containing config.json)",
                )
        if self.gguf is not None:
            try:
                self.gguf.resolve()
            except GGUFError as exc:
                raise FieldError(f"gguf.{exc.field}", exc.message) from None
        if self.tokenizer is not None and not Path(self.tokenizer).expanduser().is_dir():
            raise FieldError("tokenizer", f"no tokenizer folder at {self.tokenizer!r}")
        return self


class AnswerSpanConfig(Section):
    """Where each response's final answer is (``backends.torch.answer_span``), for a strategy
    that reads the answer span (``reads_answer_span``: ``oar_g``). Exactly one of:

    - ``after``: the text of one token (e.g. ``"="``); the answer is the response's tokens
      after its first occurrence, EOS excluded (none where the marker is missing);
    - ``last``: the answer is the response's last ``last`` tokens before its EOS.
    """

    after: str | None = Field(default=None, description="one-token marker before the answer")
    last: int | None = Field(default=None, ge=1, description="the answer is the last N tokens")

    @model_validator(mode="after")
    def _one_rule(self) -> AnswerSpanConfig:
        if (self.after is None) == (self.last is None):
            raise ValueError("set exactly one of 'after' (a marker token) or 'last' (N tokens)")
        if self.after is not None and not self.after.strip():
            raise FieldError("after", "expected the text of a token, got only whitespace")
        return self


class DataConfig(Section):
    """Prompts: a built-in task, or JSONL files with a ``prompt`` field and optional ``label``;
    ``answer_span``: where a response's final answer is, when the task has one."""

    task: str | None = Field(default=None, description="a built-in task (backends.common.tasks)")
    task_params: dict[str, Any] = Field(default_factory=dict)
    train_file: str | None = None
    eval_file: str | None = None
    num_eval_prompts: int | None = Field(default=None, ge=1, description="cap on held-out prompts")
    shuffle: bool = True
    chat_template: bool = Field(
        default=False, description="wrap each prompt as a user turn of the tokenizer's template"
    )
    answer_span: AnswerSpanConfig | None = Field(
        default=None, description="where each response's final answer is (oar_g reads it)"
    )

    @model_validator(mode="after")
    def _one_source(self) -> DataConfig:
        if (self.task is None) == (self.train_file is None):
            raise ValueError("set exactly one of 'task' (built-in) or 'train_file' (JSONL)")
        for key in ("train_file", "eval_file"):
            value = getattr(self, key)
            if value is not None and not Path(value).expanduser().is_file():
                raise FieldError(key, f"no file at {value!r}")
        if self.task is not None and self.eval_file is not None:
            raise FieldError("eval_file", "a built-in task brings its own held-out prompts")
        if self.task_params and self.task is None:
            raise FieldError("task_params", "only valid together with 'task'")
        if self.task is not None:
            problems = task_problems(self.task, self.task_params)
            if problems:
                first, *others = problems
                also = [f"also {p.field}: {p.message}" for p in others]
                raise FieldError(first.field, "; ".join([first.message, *also]))
        return self


class VLLMConfig(Section):
    """Settings of the optional vLLM rollout engine (GPU only)."""

    gpu_memory_utilization: float = Field(default=0.4, gt=0.0, le=1.0)
    tensor_parallel_size: int = Field(default=1, ge=1)
    enforce_eager: bool = True


class RolloutConfig(Section):
    """Sampling G responses per prompt.

    ``top_k = 0`` and ``top_p = 1.0`` mean off and are passed to the engine explicitly, so a
    model's own generation defaults (often ``top_k=50``) never apply.
    """

    engine: Literal["hf", "vllm"] = "hf"
    group_size: int = Field(default=4, description="G, responses per prompt (>= 2)")
    prompts_per_step: int = Field(default=4, ge=1, description="prompts per step, over all ranks")
    prompts_per_generate: int | None = Field(
        default=None, ge=1, description="prompts per generate call; default: a rank's whole shard"
    )
    max_new_tokens: int = Field(default=16, ge=1)
    temperature: float = Field(default=1.0, gt=0.0, allow_inf_nan=False)
    top_k: int = Field(default=0, ge=0, description="0 = off")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="1.0 = off")
    vllm: VLLMConfig = VLLMConfig()

    @field_validator("group_size")
    @classmethod
    def _group_size(cls, value: int) -> int:
        if value < 2:
            raise ValueError(
                f"must be >= 2: group advantages compare a response with the other samples "
                f"of its prompt, got {value}"
            )
        return value


class AlgorithmConfig(Section):
    """Advantages, PPO epochs and the clipped loss with KL against a frozen reference.

    ``estimator``: a group estimator (``credit_core.group_advantages``), or ``gae``: PPO with
    a learned critic (``critic`` section), token advantages by GAE with ``gamma`` and
    ``lam`` (docs/design.md, "PPO with a critic (GAE)"); ``gamma``/``lam`` are read only
    by ``gae``. Under ``gae`` a credit strategy moves the outcome reward between tokens
    (docs/design.md, "Credit under a critic"); one without a ``critic_reward_form`` is
    refused at ``algorithm.estimator``.
    """

    estimator: Literal["group_norm", "dr_grpo", "rloo", "gae"] = "group_norm"
    gamma: float = Field(default=1.0, ge=0.0, le=1.0, description="GAE discount (gae only)")
    lam: float = Field(default=0.95, ge=0.0, le=1.0, description="GAE lambda (gae only)")
    adv_eps: float = Field(default=1e-6, ge=0.0)
    ppo_epochs: int = Field(default=1, ge=1)
    updates_per_epoch: int = Field(
        default=1, ge=1, description="optimizer steps per pass over a batch"
    )
    micro_batch_size: int = Field(default=8, ge=1, description="responses per forward/backward")
    clip_eps_low: float = Field(default=0.2, ge=0.0, lt=1.0)
    clip_eps_high: float = Field(default=0.2, ge=0.0)
    kl_coef: float = Field(default=0.0, ge=0.0)
    kl_estimator: KLEstimator = "k3"
    loss_agg: LossAgg = "token_mean"


class CriticConfig(Section):
    """The critic of ``algorithm.estimator: gae``: a copy of the policy's decoder with a
    scalar value head (``backends.torch.critic``), trained by the clipped value loss with
    its own AdamW (``optim``'s settings and schedule, its own learning rate)."""

    lr: float | None = Field(
        default=None,
        gt=0.0,
        description="critic learning rate; null: 10 x optim.lr (the critic/actor ratio of "
        "verl's defaults, 1e-5 / 1e-6; OpenRLHF's is 9e-6 / 1e-6)",
    )
    value_clip: float = Field(
        default=0.5,
        gt=0.0,
        description="PPO value clip: new values are clipped to old +- value_clip in the "
        "loss (verl critic.cliprange_value and OpenRLHF --critic.value_clip, both 0.5)",
    )

    def learning_rate(self, policy_lr: float) -> float:
        """``lr``, or 10 x the policy's learning rate when unset."""
        return self.lr if self.lr is not None else 10.0 * policy_lr


class OptimConfig(Section):
    """AdamW with a warmup + constant/linear/cosine learning-rate schedule."""

    lr: float = Field(default=1e-5, gt=0.0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(default=1e-8, gt=0.0)
    weight_decay: float = Field(default=0.0, ge=0.0)
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = Field(default=0, ge=0)
    min_lr_ratio: float = Field(default=0.0, ge=0.0, le=1.0)
    grad_clip: float | None = Field(default=1.0, gt=0.0, description="max grad norm; null = off")


class EvalConfig(Section):
    """Held-out reward: sampled (G samples at the training temperature) and greedy."""

    interval: int = Field(
        default=0, ge=0, description="every N steps (and at steps 0 and last); 0 = off"
    )
    group_size: int | None = Field(default=None, ge=1, description="samples per prompt; default: G")
    greedy: bool = True


class CheckpointConfig(Section):
    interval: int = Field(default=0, ge=0, description="every N steps (and the last); 0 = off")
    keep_last: int = Field(default=2, ge=1)
    hf_export: Literal["final", "every"] = Field(
        default="final",
        description="where the policy is also written as a Hugging Face model (gathered on "
        "rank 0): the last step's checkpoint only, or every checkpoint",
    )
    preemption_grace_s: float | None = Field(
        default=600.0,
        gt=0,
        description="after SIGTERM/SIGUSR1 the run finishes its step, checkpoints and exits "
        "75; if that takes longer than this many seconds it ends at once (null: no limit)",
    )


class DistributedConfig(Section):
    strategy: Literal["ddp", "fsdp"] = "ddp"
    backend: Literal["auto", "gloo", "nccl"] = "auto"


class LoggingConfig(Section):
    progress: bool = True
    tensorboard: bool = True


class CreditSamplesConfig(Section):
    """A few responses of a step's batch with their token advantages, written to the run
    folder's ``credit_samples.jsonl`` and drawn as a heat-map in TensorBoard
    (``backends.torch.credit_samples``; ``credit-view`` makes a page of them)."""

    interval: int | None = Field(
        default=None,
        ge=0,
        description="every N steps (and the last); null: at every evaluation (eval.interval); "
        "0: off",
    )
    count: int = Field(default=4, ge=1, description="responses recorded per step")
    compare: list[CreditConfig] = Field(
        default_factory=list,
        description="other strategies whose token advantages are recorded for the same "
        "responses at the same policy (names or {name: ..., <params>}); one equal to the "
        "run's own credit is shown once, as the run's own (so --set credit=... keeps working)",
    )

    @field_validator("compare", mode="before")
    @classmethod
    def _compare(cls, value: Any) -> Any:
        if not isinstance(value, list):
            raise ValueError(f"expected a list of strategies, got {type(value).__name__}")
        parsed = []
        for i, item in enumerate(value):
            try:
                parsed.append(CreditConfig.parse(item))
            except CreditError as exc:
                raise FieldError(str(i), str(exc)) from None
            if parsed[-1].gate is not None:
                raise FieldError(
                    f"{i}.gate",
                    "a compared credit is shown ungated on the run's batch (its gate would "
                    "have no agreement history of its own); drop the gate",
                )
        return parsed


class TrainConfig(Section):
    """The whole run. See configs/torch/*.yaml for annotated examples."""

    seed: int = 0
    steps: int = Field(default=1, ge=1)
    output_dir: str = "runs/credit"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    credit: CreditConfig = Field(default_factory=lambda: CreditConfig(name="uniform"))
    policy: PolicyConfig
    reward: RewardSignalsConfig | None = Field(
        default=None, description="direction_model + reward (adapters); default: the task's own"
    )
    data: DataConfig
    rollout: RolloutConfig = RolloutConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    critic: CriticConfig = CriticConfig()
    optim: OptimConfig = OptimConfig()
    eval: EvalConfig = EvalConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    distributed: DistributedConfig = DistributedConfig()
    logging: LoggingConfig = LoggingConfig()
    credit_samples: CreditSamplesConfig = CreditSamplesConfig()

    @field_validator("credit", mode="before")
    @classmethod
    def _credit(cls, value: Any) -> Any:
        return CreditConfig.parse(value)

    @model_validator(mode="after")
    def _sampling_matches_stats(self) -> TrainConfig:
        sampling = {f"rollout.{key}": getattr(self.rollout, key) for key in ("top_p", "top_k")}
        for credit in (self.credit, *self.credit_samples.compare):
            reads = signals_read(strategy_class(credit.name))
            problem = sampling_problem(credit.name, reads, sampling, SAMPLING_OFF)
            if problem is not None:
                raise FieldError(problem.key, problem.message)
        return self

    @model_validator(mode="after")
    def _estimator_serves_credit(self) -> TrainConfig:
        problem = estimator_problem(
            self.credit.name,
            config_critic_form(self.credit),
            "algorithm.estimator",
            self.algorithm.estimator,
            ESTIMATORS,
            critic=("gae",),
        )
        if problem is not None:
            raise FieldError(problem.key, problem.message)
        return self

    @model_validator(mode="after")
    def _answer_span_declared(self) -> TrainConfig:
        if self.data.answer_span is not None:
            return self
        for credit in (self.credit, *self.credit_samples.compare):
            if strategy_class(credit.name).reads_answer_span:
                raise FieldError(
                    "data.answer_span",
                    f"credit strategy {credit.name!r} reads each response's answer span, but "
                    "the task declares none: set data.answer_span (e.g. {after: '='} or "
                    "{last: 1})",
                )
        return self

    @model_validator(mode="after")
    def _compared_credits_are_distinct(self) -> TrainConfig:
        seen: dict[str, str] = {}
        for i, credit in enumerate(self.credit_samples.compare):
            label = credit.label
            if label in seen:
                raise FieldError(
                    f"credit_samples.compare.{i}",
                    f"{label!r} is already {seen[label]}; list each other strategy once",
                )
            seen[label] = f"credit_samples.compare.{i}"
        return self


# ---------------------------------------------------------------------------------- loading


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"a.b=value"`` -> (["a", "b"], value parsed as YAML: numbers, booleans, lists...)."""
    key, sep, raw = text.partition("=")
    parts = key.strip().split(".")
    if not sep or not all(parts):
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE with a dotted KEY, e.g. a.b=1")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {text!r}: value is not valid YAML: {exc}") from exc
    return parts, value


def add_override_argument(parser: argparse.ArgumentParser, example: str) -> None:
    """``--set KEY=VALUE`` (repeatable, into ``args.overrides``), read by ``parse_override``."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override a config key (dotted path, YAML value), e.g. --set {example}",
    )


def apply_overrides(raw: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """A copy of ``raw`` with every ``--set key=value`` applied, in order.

    A string standing where a mapping is needed (``credit: datc`` and ``--set credit.beta=2``)
    becomes ``{name: <string>}`` first, the short form of ``CreditConfig``.
    """
    out: dict[str, Any] = _deepcopy(raw)
    for text in overrides:
        parts, value = parse_override(text)
        node = out
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif isinstance(child, str):
                child = node[part] = {"name": child}
            elif not isinstance(child, dict):
                where = ".".join(parts[: i + 1])
                raise ConfigError(
                    f"--set {text!r}: {where} is a {type(child).__name__}, not a mapping"
                )
            node = child
        node[parts[-1]] = value
    return out


def _deepcopy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _deepcopy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deepcopy(v) for v in value]
    return value


def yaml_key_lines(text: str) -> dict[tuple[str, ...], int]:
    """1-based line of every key in a YAML mapping tree, by its path of keys."""
    lines: dict[tuple[str, ...], int] = {}

    def walk(node: yaml.Node, path: tuple[str, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                sub = (*path, str(key.value))
                lines[sub] = key.start_mark.line + 1
                walk(value, sub)

    root = yaml.compose(text)
    if root is not None:
        walk(root, ())
    return lines


def config_from_dict(
    raw: Mapping[str, Any],
    overrides: Sequence[str] = (),
    *,
    source: str = "<dict>",
    yaml_text: str | None = None,
) -> TrainConfig:
    """Validate ``raw`` (+ ``--set`` overrides); raise ``ConfigError`` naming every bad key."""
    if not isinstance(raw, Mapping):
        raise ConfigError(
            f"{source}: expected a mapping at the top level, got {type(raw).__name__}"
        )
    merged = apply_overrides(raw, overrides)
    overridden = {tuple(parse_override(t)[0]): t for t in overrides}
    lines = yaml_key_lines(yaml_text) if yaml_text else {}
    try:
        return TrainConfig.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(
            format_config_errors(exc, TrainConfig, source, lines, overridden)
        ) from None


def read_yaml_config(path: str | Path) -> tuple[Any, str]:
    """The parsed content of a YAML config file and its text; ``ConfigError`` when the file
    is missing or not valid YAML (an empty file is an empty mapping)."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"config file not found: {str(file)!r}")
    text = file.read_text()
    try:
        return yaml.safe_load(text) or {}, text
    except yaml.YAMLError as exc:
        raise ConfigError(f"{file}: not valid YAML: {exc}") from exc


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> TrainConfig:
    """Read a YAML config file, apply ``--set`` overrides and validate it."""
    raw, text = read_yaml_config(path)
    return config_from_dict(raw, overrides, source=str(path), yaml_text=text)


def check_batch_split(cfg: TrainConfig, world_size: int) -> None:
    """``ConfigError`` unless a step's batch splits over ``world_size`` processes: whole
    prompt groups per rank (``data.check_shardable``), and
    ``algorithm.updates_per_epoch`` dividing each rank's responses. Needs the world size,
    so it runs when the processes exist (the trainer calls it before building anything)."""
    check_shardable(cfg.rollout.prompts_per_step, world_size)
    per_rank = cfg.rollout.prompts_per_step // world_size * cfg.rollout.group_size
    if per_rank % cfg.algorithm.updates_per_epoch:
        raise ConfigError(
            f"algorithm.updates_per_epoch={cfg.algorithm.updates_per_epoch} must divide the "
            f"responses per rank ({per_rank} = prompts_per_step / processes x group_size)"
        )


def check_device(device: str, key: str = "device") -> None:
    """``ConfigError`` when ``device`` (the value of config key ``key``) asks for CUDA on a
    machine without it; checked before anything is built, so the run stops at once."""
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"{key}: 'cuda' was requested (in the config or by --set {key}=cuda), but this "
            "machine has no usable CUDA device (torch.cuda.is_available() is False); "
            f"use {key}=cpu, or {key}=auto to take a GPU when there is one"
        )


def dump_config(config: TrainConfig, path: str | Path) -> None:
    """Write the resolved config (every default filled in) as YAML."""
    data = config.model_dump(mode="json")
    Path(path).write_text(yaml.safe_dump(data, sort_keys=False))
