"""The GRPO recipe: one readable loop, components imported (torchtune style).

One step (``train_step``), identical on every rank for its shard of the step's prompts;
each phase's inputs and outputs are named in its signature (``backends.torch.step``):

1. ``rollout(prompts, ...) -> RolloutBatch``: G responses per prompt, each generate call
   under a derived seed;
2. ``signals(batch, pool) -> StepSignals``, the credit path: rewards, ``group_advantages``
   (groups never straddle ranks), old-policy log-probs at the rollout temperature, reference
   log-probs (if ``kl_coef > 0``), only the signals the credit strategy requires (RM
   gradient, policy stats or W0, the policy's entropy from the old-policy pass, the RM's
   attention or prefix rewards from its scoring, OAR-G's answer saliency from its own policy
   forward and backward at the task's answer span), then the run's ``CreditRun.apply``:
   ``assign_credit`` (a batch-wide selection sees every rank's values through
   ``DistContext.gather_values``), the direction model's agreement with the reward from the
   reward pass's own scores and, with ``credit.gate``, the mix toward GRPO;
3. ``update(signals) -> UpdateResult``: ``ppo_epochs`` x ``updates_per_epoch`` optimizer
   steps of the clipped loss with token advantages (+ KL), micro-batched (``micro_step``
   -> ``UpdateTerms``), normalized by the step's global totals so the gradient equals the
   single-process gradient of the same global batch.

Each phase result reports its own metrics; ``StepTiming`` times the three phases.

``train(config)`` runs it in-process and returns a ``RunResult`` (metric history); the CLI
(``python -m backends.torch``) is a thin wrapper around it.
"""

from __future__ import annotations

import copy
import gc
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from adapters.answer_saliency import answer_saliency
from adapters.grad_path import HandedExpectedEmbeddings, PathGradientDirection
from adapters.policy import (
    response_logprobs_and_entropy,
    response_logprobs_and_stats,
    response_logprobs_and_work,
)
from backends.common.credit import CreditRun
from backends.common.data import Prompt, PromptSampler, shard
from backends.common.errors import ConfigError
from backends.common.preemption import PreemptionWatch, signal_name
from backends.torch import checkpoint as ckpt
from backends.torch.answer_span import AnswerSpan, build_answer_span
from backends.torch.config import (
    BACKEND,
    TrainConfig,
    check_batch_split,
    config_from_dict,
    dump_config,
    load_config,
)
from backends.torch.credit_samples import build_recorder
from backends.torch.critic import CHECKPOINT_KEY as CRITIC_KEY
from backends.torch.critic import build_critic, response_values
from backends.torch.distributed import (
    DistContext,
    full_model_state,
    grad_sync,
    init_distributed,
    load_sharded_state,
    root_gathered,
    sharded_state,
    shutdown,
    unwrap,
    wrap_model,
)
from backends.torch.gae import gae_advantages_and_returns, outcome_token_rewards, whiten
from backends.torch.implicit_prm import CHECKPOINT_KEY as PRM_KEY
from backends.torch.implicit_prm import ImplicitPRM
from backends.torch.kl import kl_estimate
from backends.torch.loss import LossNormalizer, aggregate, clipped_value_loss, ppo_clip_loss
from backends.torch.metrics import METRICS_FILE, MetricsLogger
from backends.torch.models import (
    Policy,
    PolicyModule,
    activation_checkpointing,
    build_policy,
    checkpointed_layers,
)
from backends.torch.rollout import (
    HFRolloutEngine,
    RolloutBatch,
    RolloutEngine,
    derive_seed,
    encode_prompts,
    pad_responses,
)
from backends.torch.rollout_rewards import RolloutRewards, build_prompts_and_reward
from backends.torch.run_lock import RunLock, acquire_run_lock
from backends.torch.schedule import build_optimizer
from backends.torch.step import (
    PhaseClock,
    StepSignals,
    StepTiming,
    UpdateResult,
    UpdateTerms,
    merged,
)
from credit_core import (
    CreditConfig,
    CreditError,
    CreditResult,
    CreditSignals,
    CreditStrategy,
    PolicyStats,
    group_advantages,
)
from credit_core.answer_reweighting import ANSWER_SALIENCY
from credit_core.plan import CreditPlan
from credit_core.token_rewards import critic_reward_shift

CONFIG_FILE = "config.yaml"
#: The checkpoint's ``trainer`` key of the credit's own state (the agreement gate's EMA),
#: present only when ``credit.gate`` is set.
CREDIT_KEY = "credit"
CHECKPOINT_DIR = "checkpoints"
_INNER = "module."  # PolicyModule holds the HF model as .module


@dataclass(frozen=True)
class Preempted:
    """A run stopped by ``signal`` after ``step`` (every rank the same), whose state is in
    ``checkpoint``: ``--resume`` continues from there."""

    signal: str
    step: int
    checkpoint: Path

    def message(self) -> str:
        return (
            f"{self.signal} received: stopped after step {self.step}, checkpoint "
            f"{self.checkpoint} written; continue with --resume"
        )


@dataclass
class RunResult:
    """What ``train`` returns: the run folder and every logged record ``{"step": k, ...}``;
    ``preempted`` if a stop signal ended it before ``cfg.steps``."""

    run_dir: Path
    history: list[dict[str, float]] = field(default_factory=list)
    last_step: int = 0
    preempted: Preempted | None = None

    def series(self, name: str) -> list[tuple[int, float]]:
        """(step, value) of metric ``name`` wherever it was logged."""
        return [(int(r["step"]), r[name]) for r in self.history if name in r]


@dataclass(frozen=True)
class PolicyPass:
    """One no-grad pass of a policy over a rollout batch: log-probs (B, R) at the rollout
    temperature and, when asked, ``PolicyStats`` (B, R[, d]), DATC's W0 (B, R) or the
    entropy H (B, R); 0 at padding."""

    logp: torch.Tensor
    stats: PolicyStats | None = None
    work: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    #: (response ids (b, r), m1 (b, r, d)) per micro-batch, when stats were computed
    expected: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)


def credit_plan(credit: CreditConfig | CreditStrategy) -> CreditPlan:
    """The native trainer's ``CreditPlan`` of ``credit`` (``BACKEND``). Its old-policy pass
    gives one policy-side signal: the entropy, or the statistics / W0, not both (no
    built-in strategy reads both); a strategy reading the implicit PRM says how it is
    trained (``CreditStrategy.implicit_prm``). ``ConfigError`` naming ``credit`` otherwise."""
    try:
        plan = CreditPlan.build(credit, BACKEND)
    except CreditError as err:
        raise ConfigError(str(err)) from err
    both = plan.signals & {"policy_stats", "unsigned_work"}
    if "token_entropy" in plan.signals and both:
        raise ConfigError(
            f"credit: strategy {plan.name!r} reads token_entropy together with "
            f"{sorted(both)}; the native trainer's old-policy pass gives one of them"
        )
    if "implicit_log_ratio" in plan.signals and plan.trained_model is None:
        raise ConfigError(
            f"credit: strategy {plan.name!r} reads implicit_log_ratio but gives no "
            "implicit_prm (how the native trainer builds and trains the implicit PRM)"
        )
    return plan


def _handed_expected(side: RolloutRewards) -> HandedExpectedEmbeddings | None:
    """The m1 slot of ``side``'s path-gradient direction model, when it is handed m1."""
    direction = side.direction
    if isinstance(direction, PathGradientDirection) and isinstance(
        direction.expected, HandedExpectedEmbeddings
    ):
        return direction.expected
    return None


def _labels(batch: RolloutBatch, pool: Sequence[Prompt]) -> list[Any]:
    """The label of each row's prompt (``batch.group`` indexes ``pool``)."""
    return [pool[g].label for g in batch.group.tolist()]


def _chunks(n: int, size: int) -> Iterator[slice]:
    for start in range(0, n, size):
        yield slice(start, min(n, start + size))


class GRPORecipe:
    """Owns the run's components; ``run()`` trains from the current step to ``cfg.steps``."""

    def __init__(self, cfg: TrainConfig, *, resume: bool = False) -> None:
        self.cfg = cfg
        self.ctx: DistContext = init_distributed(cfg.distributed, cfg.device)
        self.run_dir = Path(cfg.output_dir)
        self._lock: RunLock | None = None
        try:
            self._lock = self._own_run_dir()
            self._check_run_dir(resume)
            self._build(resume)
        except BaseException:
            self.close(clean=False)
            raise

    def _build(self, resume: bool) -> None:
        cfg = self.cfg
        check_batch_split(cfg, self.ctx.world_size)
        torch.manual_seed(cfg.seed)
        dev = self.ctx.device

        self.policy: Policy = build_policy(cfg.policy, seed=cfg.seed, device=dev)
        #: the run's credit plan: its strategy (built once) and the signals it computes
        self.plan = credit_plan(cfg.credit)
        self.strategy: CreditStrategy = self.plan.strategy
        prm_spec = self.plan.trained_model
        # the reference policy: for the KL term and for PRIME's log ratio (one pass serves both)
        self.ref_model = (
            copy.deepcopy(self.policy.model).requires_grad_(False)
            if cfg.algorithm.kl_coef > 0 or prm_spec is not None
            else None
        )
        self.prm: ImplicitPRM | None = None
        if prm_spec is not None:
            assert self.ref_model is not None
            prm_model = wrap_model(
                PolicyModule(copy.deepcopy(self.ref_model).requires_grad_(True)),
                self.ctx,
                cfg.distributed.strategy,
            )
            self.prm = ImplicitPRM(
                prm_model,
                ImplicitPRM.build_optimizer(prm_model, prm_spec),
                prm_spec,
                self.ctx,
                temperature=cfg.rollout.temperature,
                micro_batch_size=cfg.algorithm.micro_batch_size,
            )
        self.train_prompts, self.eval_prompts, self.reward = build_prompts_and_reward(
            cfg,
            self.policy.model,
            self.policy.tokenizer,
            device=dev,
            grad_points=self.strategy.reward_grad_points,
        )
        #: the run's credit step: the plan, and the agreement gate if ``credit.gate`` is set
        try:
            self.credit_run = CreditRun(
                self.plan,
                cfg.credit.gate,
                direction_is_reward=self.reward.signals.direction_is_reward,
            )
        except CreditError as err:
            raise ConfigError(str(err)) from err
        direction = self.reward.direction
        if self.plan.needs_direction and direction is None:
            raise ConfigError(
                f"credit: strategy {cfg.credit.name!r} needs a differentiable reward model "
                "(reward.direction_model), but the config has none"
            )
        if direction is not None:
            problem = self.plan.direction_problem(
                "reward.direction_model",
                type(direction).__name__,
                gives_attention=direction.gives_attention,
                path_problem=None,  # build_prompts_and_reward built it for grad_points
            )
            if problem is not None:
                raise ConfigError(str(problem))
        # algorithm.estimator gae: the critic, copied from the policy before FSDP shards it
        critic = build_critic(self.policy.model, seed=cfg.seed) if self._gae else None
        if "reward_attribution" in self.plan.signals and direction is not None:
            try:
                direction.null_embedding(self.strategy.attribution_null)
            except CreditError as err:
                raise ConfigError(
                    f"credit: strategy {cfg.credit.name!r} reads reward_attribution: {err}"
                ) from err
        span = cfg.data.answer_span
        self.answer_span: AnswerSpan | None = (
            None
            if span is None
            else build_answer_span(span, self.policy.tokenizer, self.policy.eos_ids)
        )
        if (
            ANSWER_SALIENCY in self.plan.signals
            and self.ctx.active
            and cfg.distributed.strategy == "fsdp"
        ):
            raise ConfigError(
                f"distributed.strategy: 'fsdp'; credit strategy {cfg.credit.name!r} takes the "
                "policy's own input gradient (answer_saliency) on its whole, unsharded weights: "
                "use 'ddp'"
            )
        self.model = wrap_model(PolicyModule(self.policy.model), self.ctx, cfg.distributed.strategy)
        self.checkpointed = checkpointed_layers(self.model)  # policy.gradient_checkpointing
        self.optimizer, self.scheduler = build_optimizer(self.model, cfg.optim, cfg.steps)
        self.critic: torch.nn.Module | None = None
        if critic is not None:
            self.critic = wrap_model(critic, self.ctx, cfg.distributed.strategy)
            self.critic_checkpointed = checkpointed_layers(self.critic)
            critic_optim = cfg.optim.model_copy(
                update={"lr": cfg.critic.learning_rate(cfg.optim.lr)}
            )
            self.critic_optimizer, self.critic_scheduler = build_optimizer(
                self.critic, critic_optim, cfg.steps
            )
        self.sampler = PromptSampler(
            len(self.train_prompts),
            cfg.rollout.prompts_per_step,
            seed=cfg.seed,
            shuffle=cfg.data.shuffle,
        )
        self.engine = self._build_engine()
        self._weights_version, self._engine_version = 0, -1  # the engine syncs before use
        self.step = 0
        if resume:
            self._resume()
        if self.ctx.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            dump_config(cfg, self.run_dir / CONFIG_FILE)
        self.logger = MetricsLogger(
            self.run_dir,
            total_steps=cfg.steps,
            start_step=self.step,
            enabled=self.ctx.is_main,
            tensorboard=cfg.logging.tensorboard,
            progress=cfg.logging.progress,
        )
        self.samples = build_recorder(
            cfg,
            reward=self.reward,
            policy=self.policy,
            credit=self.signals,
            start_step=self.step,
            is_main=self.ctx.is_main,
            logger=self.logger,
        )

    @property
    def _gae(self) -> bool:
        """PPO with a critic (``algorithm.estimator: gae``)."""
        return self.cfg.algorithm.estimator == "gae"

    # ------------------------------------------------------------------------------ setup

    def _own_run_dir(self) -> RunLock | None:
        """Rank 0 locks the run folder for the life of the run (``run_lock``); every rank
        raises the same ``RunFolderBusyError`` if a live run holds it."""
        lock, refusal = None, None
        if self.ctx.is_main:
            try:
                lock = acquire_run_lock(self.run_dir)
            except (ConfigError, OSError) as exc:
                refusal = exc
        refusal = self.ctx.broadcast_object(refusal)
        if refusal is not None:
            raise refusal
        return lock

    def _check_run_dir(self, resume: bool) -> None:
        holds_run = (self.run_dir / METRICS_FILE).exists() or (
            self.run_dir / CHECKPOINT_DIR
        ).exists()
        if self.ctx.is_main:
            ckpt.remove_partial(self.run_dir / CHECKPOINT_DIR)
        if holds_run and not resume:
            raise ConfigError(
                f"output_dir: {str(self.run_dir)!r} already holds a run; pass --resume to "
                "continue it from its newest intact checkpoint (from step 0 if it was stopped "
                "before its first one), or choose another output_dir"
            )

    def _build_engine(self) -> RolloutEngine:
        p = self.policy
        if self.cfg.rollout.engine == "hf":
            return HFRolloutEngine(
                unwrap(self.model).module,
                self.cfg.rollout,
                pad_id=p.pad_id,
                eos_ids=p.eos_ids,
                synced=self.ctx.active and self.cfg.distributed.strategy == "fsdp",
            )
        from backends.torch.rollout_vllm import VLLMRolloutEngine

        path = p.model_path
        if path is None:  # a preset policy: the engine loads it from a folder we write
            path = str(self.run_dir / "policy_init")
            # from the full state dict: under FSDP the parameters are already DTensor shards
            full = full_model_state(self.model, self.ctx)
            if full is not None:
                weights = {k.removeprefix(_INNER): v for k, v in full.items()}
                p.model.save_pretrained(path, state_dict=weights)
                p.tokenizer.save_pretrained(path)
            self.ctx.barrier()
        return VLLMRolloutEngine(
            path,
            self.cfg.rollout,
            dtype=self.cfg.policy.dtype,
            pad_id=p.pad_id,
            eos_ids=p.eos_ids,
            seed=self.cfg.seed,
        )

    def _check_same_run(self) -> None:
        """A resumed run must be the same run: only steps, eval, checkpoint, logging and
        credit_samples may change, and output_dir (where the run folder is now, after a move
        or a copy)."""
        saved_file = self.run_dir / CONFIG_FILE
        if not saved_file.exists():
            return
        saved = load_config(saved_file).model_dump(mode="json")
        now = self.cfg.model_dump(mode="json")
        free = {"steps", "eval", "checkpoint", "logging", "credit_samples", "output_dir"}
        changed = sorted(k for k in now if k not in free and now[k] != saved.get(k))
        if changed:
            raise ConfigError(
                f"--resume: the config differs from the run's {saved_file} in {changed}; "
                f"only {sorted(free)} may change when resuming"
            )

    def _resume(self) -> None:
        """Continue from the newest intact checkpoint (damaged newer ones are moved aside);
        with none, the run starts again from step 0 (``resume_point`` says so)."""
        self._check_same_run()
        latest = ckpt.resume_point(self.run_dir / CHECKPOINT_DIR, self.ctx)
        if latest is None:
            return
        model_state, optim_state = sharded_state(self.model, self.optimizer)
        state = ckpt.load_checkpoint(
            latest, model_state, optim_state, self.ctx, extra_state=self._extra_state()
        )
        load_sharded_state(self.model, self.optimizer, state.model, state.optimizer)
        if self.prm is not None:
            prm = state.extra[PRM_KEY]
            load_sharded_state(self.prm.model, self.prm.optimizer, prm["model"], prm["optimizer"])
        self.scheduler.load_state_dict(state.scheduler)
        if self.critic is not None:
            critic = state.extra[CRITIC_KEY]
            load_sharded_state(
                self.critic, self.critic_optimizer, critic["model"], critic["optimizer"]
            )
            self.critic_scheduler.load_state_dict(state.trainer["critic_scheduler"])
        self.sampler.load_state_dict(state.trainer["sampler"])
        if self.credit_run.gate is not None:
            self.credit_run.load_state_dict(state.trainer[CREDIT_KEY])
        self.strategy.load_state_dict(state.rank["strategy"])
        ckpt.restore_rng(state.rank["rng"], self.ctx.device)
        self.step = state.step

    def _extra_state(self) -> dict[str, Any]:
        """The DCP state dicts of the trained models beside the policy, each with its
        optimizer's, as ``TrainingState.extra``: the critic (``algorithm.estimator: gae``)
        and PRIME's pi_phi; empty for most runs; collective."""
        models = {CRITIC_KEY: (self.critic, self.critic_optimizer)} if self.critic else {}
        if self.prm is not None:
            models[PRM_KEY] = (self.prm.model, self.prm.optimizer)
        extra: dict[str, Any] = {}
        for key, (model, optimizer) in models.items():
            model_state, optim_state = sharded_state(model, optimizer)
            extra[key] = {"model": model_state, "optimizer": optim_state}
        return extra

    def save(self) -> Path:
        """Write a checkpoint of the current step (collective; every rank writes its shards);
        the last step's (or, with ``checkpoint.hf_export: every``, each one) also holds the
        policy as a Hugging Face model, gathered on rank 0."""
        model_state, optim_state = sharded_state(self.model, self.optimizer)
        exporting = self.cfg.checkpoint.hf_export == "every" or self.step == self.cfg.steps
        full = full_model_state(self.model, self.ctx) if exporting else None
        export = None
        if full is not None:  # PolicyModule keys -> the HF model's own names
            export = ckpt.ModelExport(
                weights={k.removeprefix(_INNER): v for k, v in full.items()},
                files={"config.json": self.policy.model.config.to_json_string()},
            )
        state = ckpt.TrainingState(
            step=self.step,
            model=model_state,
            optimizer=optim_state,
            scheduler=self.scheduler.state_dict(),
            trainer={
                "sampler": self.sampler.state_dict(),
                **(
                    {"critic_scheduler": self.critic_scheduler.state_dict()}
                    if self.critic is not None
                    else {}
                ),
                **(
                    {CREDIT_KEY: self.credit_run.state_dict()}
                    if self.credit_run.gate is not None
                    else {}
                ),
            },
            rank={"rng": ckpt.capture_rng(self.ctx.device), "strategy": self.strategy.state_dict()},
            extra=self._extra_state(),
        )
        return ckpt.save_checkpoint(
            self.run_dir / CHECKPOINT_DIR,
            state,
            export=export,
            ctx=self.ctx,
            keep_last=self.cfg.checkpoint.keep_last,
        )

    # ---------------------------------------------------------------------------- rollout

    def rollout(
        self,
        prompts: Sequence[Prompt],
        positions: Sequence[int],
        groups: Sequence[int],
        *,
        group_size: int,
        greedy: bool,
        tag: str,
    ) -> RolloutBatch:
        """Responses for this rank's prompts, one generate call per chunk of prompts.

        ``positions`` are the prompts' places in the step's global batch: the seed of a chunk
        depends on the position of its first prompt, not on the rank that samples it.
        """
        per_call = self.cfg.rollout.prompts_per_generate or max(1, len(prompts))
        if self._engine_version != self._weights_version:  # weights changed since last sync
            self.engine.sync_weights(self.model)
            self._engine_version = self._weights_version
        parts = []
        with root_gathered(self.model, reshard=True):
            for sl in _chunks(len(prompts), per_call):
                ids, mask = encode_prompts(
                    self.policy.tokenizer,
                    [p.text for p in prompts[sl]],
                    self.policy.pad_id,
                    chat_template=self.cfg.data.chat_template,
                )
                dev = self.ctx.device
                parts.append(
                    self.engine.generate(
                        ids.to(dev),
                        mask.to(dev),
                        torch.tensor(groups[sl], device=dev),
                        group_size=group_size,
                        greedy=greedy,
                        seed=derive_seed(self.cfg.seed, tag, self.step, positions[sl][0]),
                    )
                )
        return RolloutBatch.cat(parts)

    # ---------------------------------------------------------------------------- signals

    def _old_policy_pass(
        self,
        model: torch.nn.Module,
        batch: RolloutBatch,
        *,
        embedding: torch.Tensor | None = None,
        stats: bool = False,
        reward_grad: torch.Tensor | None = None,
        entropy: bool = False,
    ) -> PolicyPass:
        """No-grad log-probs (B, R) at the rollout temperature, micro-batched, with
        ``PolicyStats`` (``stats``) or DATC's W0 from ``reward_grad`` (B, R, d), both needing
        the reward embedding table ``embedding`` (V, d), or the entropy (``entropy``, from
        the log-probs' own streamed LM-head pass), in the same forward."""
        cfg = self.cfg
        emb = embedding
        R = batch.response_len
        logps, parts, works, entropies = [], [], [], []
        expected: list[tuple[torch.Tensor, torch.Tensor]] = []
        with torch.no_grad():
            for rows, mb in batch.micro_batches(cfg.algorithm.micro_batch_size):
                with root_gathered(model, reshard=False):
                    if reward_grad is not None and emb is not None:
                        logp, w0 = response_logprobs_and_work(
                            model,
                            mb.input_ids,
                            mb.attention_mask,
                            mb.response_len,
                            temperature=cfg.rollout.temperature,
                            reward_embedding=emb,
                            reward_grad=reward_grad[rows, : mb.response_len],
                        )
                        works.append(pad_responses(w0, R))
                    elif entropy:
                        logp, h = response_logprobs_and_entropy(
                            model,
                            mb.input_ids,
                            mb.attention_mask,
                            mb.response_len,
                            temperature=cfg.rollout.temperature,
                        )
                        entropies.append(pad_responses(h, R))
                    else:
                        logp, st = response_logprobs_and_stats(
                            model,
                            mb.input_ids,
                            mb.attention_mask,
                            mb.response_len,
                            temperature=cfg.rollout.temperature,
                            reward_embedding=emb if stats else None,
                        )
                        if st is not None:
                            parts.append(st.pad_to(R))
                            expected.append((mb.response_ids, st.m1))
                logps.append(pad_responses(logp, R))
        return PolicyPass(
            torch.cat(logps),
            PolicyStats.cat(parts) if parts else None,
            torch.cat(works) if works else None,
            torch.cat(entropies) if entropies else None,
            expected,
        )

    def signals(
        self,
        batch: RolloutBatch,
        pool: Sequence[Prompt],
        *,
        strategy: CreditStrategy | None = None,
        rewards: RolloutRewards | None = None,
        advance: bool = False,
    ) -> StepSignals:
        """The credit path: rewards, advantages, old/ref log-probs, the strategy's signals
        and token advantages of ``batch`` (whose ``group`` indexes ``pool``).

        Used by training, and by anything that wants the trainer's own credit for a batch
        (the ablation probes, ``benchmarks/step.py``). ``strategy`` and ``rewards`` replace
        the run's own for this call (the probes judge other credits on the same batch).

        Every strategy is run on GRPO's ``group_norm`` response advantages under
        ``algorithm.estimator: gae`` (the estimator the strategies are defined with); the
        run's own credit is then PPO's (``_gae_credit``: the strategy's result as a shift of
        the outcome token rewards, the critic's values, GAE, whitened), while another
        ``strategy`` judged on the batch keeps its token advantages (docs/design.md, "PPO
        with a critic (GAE)", "Credit under a critic").

        ``advance``: this is the training step's batch: the run's credit state moves on
        (``CreditRun.apply``: the agreement gate's EMA); a look at any other batch leaves it.
        """
        cfg = self.cfg
        own = strategy is None or strategy is self.strategy
        plan = self.plan if strategy is None or own else credit_plan(strategy)
        strategy = plan.strategy
        side = rewards or self.reward
        reads = plan.signals
        if plan.needs_direction and side.direction is None:
            raise ConfigError(f"credit: strategy {strategy.name!r} needs a direction model")
        path = plan.path
        if path:  # the path gradient starts from the old policy's m1: that pass comes first
            old = self._old_policy_pass(self.model, batch, embedding=side.embedding, stats=True)
            handed = _handed_expected(side)
            if handed is not None:
                handed.hand(old.expected)
        clock = PhaseClock(self.ctx.device)
        reward = side.compute(
            batch,
            with_grad=plan.needs_reward_grad,
            micro_batch_size=cfg.algorithm.micro_batch_size,
            labels=_labels(batch, pool),
            with_attention="reward_attention" in reads,
            with_prefix_rewards="prefix_rewards" in reads,
        )
        reward_seconds = clock.lap()
        estimator = "group_norm" if self._gae else cfg.algorithm.estimator
        attribution = None
        if "reward_attribution" in reads:
            assert side.direction is not None and reward.reward_grad is not None  # checked above
            attribution = side.direction.attribution(
                reward.reward_grad,
                batch.response_ids,
                batch.response_mask,
                strategy.attribution_null,
            )
        advantages = group_advantages(
            reward.rewards, cfg.rollout.group_size, estimator, cfg.algorithm.adv_eps
        )
        if not path:
            old = self._old_policy_pass(
                self.model,
                batch,
                embedding=side.embedding,
                stats="policy_stats" in reads,
                reward_grad=reward.reward_grad if "unsigned_work" in reads else None,
                entropy="token_entropy" in reads,
            )
        answer_mask = self._answer_mask(batch, strategy)
        saliency = None
        if ANSWER_SALIENCY in reads:
            assert answer_mask is not None  # _answer_mask refuses a strategy without a span
            saliency = self._answer_saliency_pass(batch, answer_mask, strategy.answer_noise_std)
        ref_logp = kl_ref = log_ratio = None
        if self.ref_model is not None:
            ref_logp = self._old_policy_pass(self.ref_model, batch).logp
        if cfg.algorithm.kl_coef > 0:
            assert ref_logp is not None
            kl_ref = kl_estimate(old.logp, ref_logp, cfg.algorithm.kl_estimator)
        if "implicit_log_ratio" in reads:
            if self.prm is None or ref_logp is None:
                raise ConfigError(
                    f"credit: strategy {strategy.name!r} reads the implicit PRM, which the "
                    "trainer builds only when the run's own strategy reads it"
                )
            log_ratio = self._old_policy_pass(self.prm.model, batch).logp - ref_logp
        run = (
            self.credit_run
            if own
            else CreditRun(plan, direction_is_reward=side.signals.direction_is_reward)
        )
        step = run.apply(
            advantages,
            batch.response_mask,
            batch.response_ids,
            CreditSignals(
                reward_grad=reward.reward_grad if "reward_grad" in reads else None,
                policy_stats=old.stats,
                unsigned_work=old.work,
                token_entropy=old.entropy,
                reward_attention=reward.attention,
                prefix_rewards=reward.prefix_rewards,
                reward_attribution=attribution,
                implicit_log_ratio=log_ratio,
                answer_saliency=saliency,
            ),
            rewards=reward.rewards,
            groups=self._group_ids(batch),
            direction_scores=reward.direction_scores,
            gather=self.ctx.gather_values,
            reduce_sum=self.ctx.all_reduce_sum,
            answer_mask=answer_mask,
            advance=advance,
        )
        signals = StepSignals(
            batch=batch,
            rewards=reward.rewards,
            advantages=advantages,
            old_logp=old.logp,
            ref_logp=ref_logp,
            credit=step.result,
            kl_ref=kl_ref,
            reward_diagnostics=reward.diagnostics,
            reward_grad_rows=batch.size if reward.reward_grad is not None else 0,
            policy_stats_rows=batch.size if old.stats is not None or old.work is not None else 0,
            reward_seconds=reward_seconds,
            agreement=step.agreement,
        )
        return self._gae_credit(signals) if own and self._gae else signals

    def _gae_credit(self, signals: StepSignals) -> StepSignals:
        """PPO's signals from GRPO's ``signals`` of the run's own strategy: the outcome reward
        at each response's last token plus the strategy's credit as a shift of it
        (``critic_reward_shift`` of ``signals.credit``, formed on GRPO's ``group_norm``
        response advantages; exactly 0 for ``uniform``), the critic's values (one no-grad
        pass), GAE advantages and returns, the advantages whitened over the step's valid
        tokens on all ranks; ``credit`` then holds the whitened GAE token advantages with the
        strategy's diagnostics (docs/design.md, "PPO with a critic (GAE)", "Credit under a
        critic"). The KL term, if any, stays in the loss (``micro_step``)."""
        alg = self.cfg.algorithm
        batch = signals.batch
        mask = batch.response_mask
        form = self.strategy.critic_reward_form
        assert form is not None  # TrainConfig refuses a strategy without one under gae
        shift = critic_reward_shift(
            signals.credit,
            signals.advantages,
            signals.rewards,
            self._group_ids(batch),
            mask,
            form,
            name=self.strategy.name,
        )
        values = self._critic_values(batch)
        adv, returns = gae_advantages_and_returns(
            outcome_token_rewards(signals.rewards, mask) + shift,
            values,
            mask,
            gamma=alg.gamma,
            lam=alg.lam,
        )
        token_adv = whiten(adv, mask, self.ctx.all_reduce_sum)
        return replace(
            signals,
            advantages=token_adv[:, 0],
            credit=CreditResult(token_adv, signals.credit.diagnostics),
            values=values,
            returns=returns,
        )

    def _critic_values(self, batch: RolloutBatch) -> torch.Tensor:
        """The critic's no-grad values (B, R) of ``batch``, micro-batched, 0 at padding."""
        assert self.critic is not None
        parts = []
        with torch.no_grad():
            for _rows, mb in batch.micro_batches(self.cfg.algorithm.micro_batch_size):
                v = response_values(self.critic, mb.input_ids, mb.attention_mask, mb.response_len)
                parts.append(pad_responses(v, batch.response_len))
        return torch.cat(parts)

    def _answer_mask(self, batch: RolloutBatch, strategy: CreditStrategy) -> torch.Tensor | None:
        """(B, R) bool: each response's answer span (``data.answer_span``) for a strategy that
        reads it, else None (nothing is computed); ``ConfigError`` for a strategy that reads
        the span where the task declares none."""
        if not strategy.reads_answer_span:
            return None
        if self.answer_span is None:
            raise ConfigError(
                f"data.answer_span: credit strategy {strategy.name!r} reads each "
                "response's answer span, but the task declares none"
            )
        return self.answer_span.mask(batch.response_ids, batch.response_mask)

    def _answer_saliency_pass(
        self, batch: RolloutBatch, answer_mask: torch.Tensor, noise_std: float
    ) -> torch.Tensor:
        """OAR-G's s (B, R) of the current policy (``adapters.answer_saliency``), micro-batched:
        per micro-batch one no-grad forward and one forward + backward to the input
        embeddings, the weights frozen; the noise is drawn from a generator seeded by (seed,
        step, rank) on the policy's device."""
        cfg = self.cfg
        dev = self.ctx.device
        generator = torch.Generator(device=dev)
        generator.manual_seed(derive_seed(cfg.seed, ANSWER_SALIENCY, self.step, self.ctx.rank))
        inner = unwrap(self.model).module
        R = batch.response_len
        parts = []
        for rows, mb in batch.micro_batches(cfg.algorithm.micro_batch_size):
            s = answer_saliency(
                inner,
                mb.input_ids,
                mb.attention_mask,
                mb.response_len,
                answer_mask[rows, : mb.response_len],
                noise_std=noise_std,
                generator=generator,
            )
            parts.append(pad_responses(s, R))
        return torch.cat(parts)

    def _group_ids(self, batch: RolloutBatch) -> torch.Tensor:
        """(B,) int64: the group of each row (rows are ordered group by group on a rank)."""
        rows = torch.arange(batch.size, device=batch.response_ids.device)
        return rows // self.cfg.rollout.group_size

    # ----------------------------------------------------------------------------- update

    def update(self, signals: StepSignals) -> UpdateResult:
        """All optimizer updates of one step on ``signals`` (see the module docstring);
        with a critic, its updates on the same micro-batches, beside the policy's."""
        cfg, alg = self.cfg, self.cfg.algorithm
        batch = signals.batch
        per_update = batch.size // alg.updates_per_epoch
        terms, grad_norm_sum, n_updates = UpdateTerms(), 0.0, 0
        critic_norm_sum = 0.0
        for _epoch in range(alg.ppo_epochs):
            for u in range(alg.updates_per_epoch):
                rows = slice(u * per_update, (u + 1) * per_update)
                mask = batch.response_mask[rows]
                totals = self.ctx.all_reduce_sum(
                    torch.tensor(
                        [float(mask.sum()), float(mask.shape[0])],
                        dtype=torch.float64,
                        device=self.ctx.collective_device,
                    )
                )
                norm = LossNormalizer(
                    float(totals[0]), float(totals[1]), cfg.rollout.max_new_tokens
                )
                self.optimizer.zero_grad(set_to_none=True)
                if self.critic is not None:
                    self.critic_optimizer.zero_grad(set_to_none=True)
                micro = list(_chunks(per_update, alg.micro_batch_size))
                for i, sl in enumerate(micro):
                    idx = slice(rows.start + sl.start, rows.start + sl.stop)
                    with grad_sync(self.model, i == len(micro) - 1):
                        terms = terms + self.micro_step(signals, idx, norm)
                    if self.critic is not None:
                        with grad_sync(self.critic, i == len(micro) - 1):
                            terms = terms + self.critic_micro_step(signals, idx, norm)
                grad_norm_sum += self._optimizer_step()
                if self.critic is not None:
                    critic_norm_sum += self._critic_optimizer_step()
                n_updates += 1
        lr = float(self.scheduler.get_last_lr()[0])
        if self.critic is None:
            return UpdateResult(terms, grad_norm_sum, n_updates, lr)
        critic_lr = float(self.critic_scheduler.get_last_lr()[0])
        return UpdateResult(terms, grad_norm_sum, n_updates, lr, critic_norm_sum, critic_lr)

    def micro_step(self, signals: StepSignals, idx: slice, norm: LossNormalizer) -> UpdateTerms:
        """Forward and backward of the loss on rows ``idx``; its terms on this rank."""
        alg = self.cfg.algorithm
        mb = signals.batch.select(idx)
        R = mb.response_len
        mask = mb.response_mask
        with root_gathered(self.model, reshard=False), activation_checkpointing(self.checkpointed):
            logp, _ = response_logprobs_and_stats(
                self.model,
                mb.input_ids,
                mb.attention_mask,
                R,
                temperature=self.cfg.rollout.temperature,
            )
        terms = ppo_clip_loss(
            logp,
            signals.old_logp[idx, :R],
            signals.token_advantages[idx, :R],
            clip_eps_low=alg.clip_eps_low,
            clip_eps_high=alg.clip_eps_high,
        )
        pg = aggregate(terms.loss, mask, alg.loss_agg, norm)
        loss = pg
        kl_term = torch.zeros((), dtype=pg.dtype)
        if alg.kl_coef > 0:
            assert signals.ref_logp is not None
            kl = kl_estimate(logp, signals.ref_logp[idx, :R], alg.kl_estimator)
            kl_term = aggregate(kl, mask, alg.loss_agg, norm)
            loss = pg + alg.kl_coef * kl_term
        if not bool(torch.isfinite(loss)):
            raise FloatingPointError(
                f"step {self.step}: non-finite loss ({float(loss)}); lower optim.lr, or check "
                "the reward and the KL coefficient"
            )
        # DDP/FSDP average gradients over ranks; the normalizers are global: undo the mean
        (loss * self.ctx.world_size).backward()  # type: ignore[no-untyped-call]
        return UpdateTerms(
            policy_loss=float(pg.detach()),
            kl_loss=float(kl_term.detach()),
            clipped_tokens=float((terms.clipped & mask).sum()),
            tokens=float(mask.sum()),
            neg_log_ratio=float((-terms.log_ratio * mask).sum()),
        )

    def critic_micro_step(
        self, signals: StepSignals, idx: slice, norm: LossNormalizer
    ) -> UpdateTerms:
        """Forward and backward of the critic's clipped value loss on rows ``idx``
        (aggregated as the policy loss, ``algorithm.loss_agg``); its terms on this rank."""
        assert self.critic is not None
        assert signals.values is not None and signals.returns is not None
        alg = self.cfg.algorithm
        mb = signals.batch.select(idx)
        R = mb.response_len
        mask = mb.response_mask
        with activation_checkpointing(self.critic_checkpointed):
            values = response_values(self.critic, mb.input_ids, mb.attention_mask, R)
        terms = clipped_value_loss(
            values,
            signals.values[idx, :R],
            signals.returns[idx, :R],
            clip=self.cfg.critic.value_clip,
        )
        loss = aggregate(terms.loss, mask, alg.loss_agg, norm)
        if not bool(torch.isfinite(loss)):
            raise FloatingPointError(
                f"step {self.step}: non-finite value loss ({float(loss)}); lower critic.lr"
            )
        (loss * self.ctx.world_size).backward()  # type: ignore[no-untyped-call]
        return UpdateTerms(
            value_loss=float(loss.detach()),
            value_clipped_tokens=float((terms.clipped & mask).sum()),
        )

    def _optimizer_step(self) -> float:
        norm = self._clip_grads(self.model)
        self.optimizer.step()
        self._weights_version += 1
        return norm

    def _critic_optimizer_step(self) -> float:
        assert self.critic is not None
        norm = self._clip_grads(self.critic)
        self.critic_optimizer.step()
        return norm

    def _clip_grads(self, model: torch.nn.Module) -> float:
        """Clip ``model``'s gradient norm to ``optim.grad_clip``; its norm before clipping."""
        clip = self.cfg.optim.grad_clip
        params = [p for p in model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, clip if clip is not None else math.inf)
        full = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        return float(full)

    # ------------------------------------------------------------------------------- step

    def _my_prompts(
        self, indices: Sequence[int], pool: Sequence[Prompt]
    ) -> tuple[list[Prompt], list[int], list[int]]:
        """This rank's prompts, their positions in the global list and their group ids."""
        mine = shard(list(enumerate(indices)), self.ctx.rank, self.ctx.world_size)
        return [pool[i] for _, i in mine], [pos for pos, _ in mine], [i for _, i in mine]

    def train_step(self) -> dict[str, float]:
        """One GRPO step on the next prompts; returns the step's (global) metrics."""
        cfg = self.cfg
        self.step += 1
        clock = PhaseClock(self.ctx.device)
        prompts, positions, groups = self._my_prompts(self.sampler.next_batch(), self.train_prompts)
        batch = self.rollout(
            prompts,
            positions,
            groups,
            group_size=cfg.rollout.group_size,
            greedy=False,
            tag="rollout",
        )
        t_rollout = clock.lap()
        signals = self.signals(batch, self.train_prompts, advance=True)
        t_signals = clock.lap()
        # at the policy that sampled the batch; timed on its own (time/credit_samples)
        recorded = self.samples.record(self.step, signals, self.train_prompts)
        clock.lap()
        prm = {}
        if self.prm is not None:  # after the credit, on this step's rollouts and outcomes
            assert signals.ref_logp is not None
            labels = self.prm.spec.labels(signals.rewards)
            prm = self.prm.update(batch, signals.ref_logp, labels).metrics()
        update = self.update(signals)
        self.scheduler.step()
        if self.critic is not None:
            self.critic_scheduler.step()
        timing = StepTiming(
            t_rollout,
            t_signals,
            signals.reward_seconds,
            clock.lap(),
            float(batch.response_mask.sum()),
        )
        return merged(
            signals.metrics(self.ctx, self.policy.eos_ids),
            update.metrics(self.ctx, cfg.algorithm.kl_coef),
            timing.metrics(self.ctx),
            recorded,
            prm,
        )

    # ------------------------------------------------------------------------------- eval

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Held-out reward: sampled (G at the training temperature) and greedy.

        Every rank gets ceil(n / ranks) prompts (the last ranks wrap around to the first
        prompts, whose extra copies are not counted), so all ranks run the same number of
        generate calls, as FSDP's collective forwards require.
        """
        cfg = self.cfg
        n = len(self.eval_prompts)
        if n == 0:
            return {}
        per = -(-n // self.ctx.world_size)
        positions = list(range(self.ctx.rank * per, (self.ctx.rank + 1) * per))
        indices = [p % n for p in positions]
        prompts = [self.eval_prompts[i] for i in indices]
        counted = torch.tensor([p < n for p in positions])
        out: dict[str, float] = {}
        modes = [("sampled", False, cfg.eval.group_size or cfg.rollout.group_size)]
        if cfg.eval.greedy:
            modes.append(("greedy", True, 1))
        for name, greedy, g_size in modes:
            batch = self.rollout(
                prompts, positions, indices, group_size=g_size, greedy=greedy, tag=f"eval_{name}"
            )
            rewards = self.reward.compute(
                batch,
                with_grad=False,
                micro_batch_size=cfg.algorithm.micro_batch_size,
                labels=_labels(batch, self.eval_prompts),
            ).rewards
            keep = counted.repeat_interleave(g_size).to(rewards.device)
            lengths = batch.response_mask.sum(dim=1)
            sums = torch.tensor(
                [float(rewards[keep].sum()), float(keep.sum()), float(lengths[keep].sum())],
                dtype=torch.float64,
                device=self.ctx.collective_device,
            )
            g = self.ctx.all_reduce_sum(sums)
            out[f"eval/reward_{name}"] = float(g[0] / g[1])
            out[f"eval/length_{name}"] = float(g[2] / g[1])
        return out

    # -------------------------------------------------------------------------------- run

    def _due(self, interval: int) -> bool:
        return interval > 0 and (self.step % interval == 0 or self.step == self.cfg.steps)

    def _stop_signal(self, watch: PreemptionWatch) -> int:
        """The stop signal any rank received (0: none); collective, so every rank stops at
        the same step."""
        flag = torch.tensor([float(watch.requested)], dtype=torch.float64)
        return int(self.ctx.all_reduce_max(flag)[0])

    def run(self, at_eval: Callable[[], dict[str, float]] | None = None) -> RunResult:
        """Train to ``cfg.steps``; log every step, evaluate and checkpoint when due.

        ``at_eval()`` is merged into every evaluation record (the ablation's measurements).
        A stop signal (``backends.common.preemption``) ends the run after the step in progress,
        with a checkpoint of that step (``RunResult.preempted``).
        """
        cfg = self.cfg
        extra = at_eval or dict
        preempted = None
        watch = PreemptionWatch("credit-train", grace_s=cfg.checkpoint.preemption_grace_s)
        try:
            with watch:
                if self.step == 0 and cfg.eval.interval > 0:
                    self.logger.log(0, {**self.evaluate(), **extra()})
                while self.step < cfg.steps:
                    metrics = self.train_step()
                    if self._due(cfg.eval.interval):
                        metrics.update(self.evaluate())
                        metrics.update(extra())
                    self.logger.log(self.step, metrics)
                    stop = self._stop_signal(watch)
                    if self._due(cfg.checkpoint.interval) or stop:
                        saved = self.save()
                        if stop and self.step < cfg.steps:
                            preempted = Preempted(signal_name(stop), self.step, saved)
                    self.logger.advance()
                    if preempted is not None:
                        break
        finally:
            self.logger.close()
        return RunResult(self.run_dir, self.logger.history, self.step, preempted)

    def close(self, *, clean: bool = True) -> None:
        """Release the run: every rank done (``clean``: a run that ended normally; after an
        error the ranks may not meet again, so there is no barrier), then everything that
        holds the process group (the DDP/FSDP-wrapped model, its optimizer, the rollout
        engine) freed while the group is still registered, then the group destroyed, then
        the run folder's lock.

        The order matters: a DDP reducer freed after ``destroy_process_group`` destroys the
        gloo group itself, holding the GIL, while a gloo worker thread may need the GIL to
        free the last tensors of a finished collective: the process then never exits."""
        if clean and self.ctx.active:
            self.ctx.barrier()
        for name in (
            "model",
            "optimizer",
            "scheduler",
            "critic",
            "critic_optimizer",
            "critic_scheduler",
            "engine",
            "policy",
            "ref_model",
            "prm",
        ):
            self.__dict__.pop(name, None)
        gc.collect()
        shutdown(self.ctx, barrier=clean)
        if self._lock is not None:
            self._lock.release()


def resolve_config(
    config: TrainConfig | Mapping[str, Any] | str | Path, overrides: Sequence[str] = ()
) -> TrainConfig:
    """A ``TrainConfig`` from a config object, a mapping or a YAML path (+ ``--set`` overrides)."""
    if isinstance(config, TrainConfig):
        if not overrides:
            return config
        config = config.model_dump(mode="json")
    if isinstance(config, Mapping):
        return config_from_dict(config, overrides)
    return load_config(config, overrides)


def train(
    config: TrainConfig | Mapping[str, Any] | str | Path,
    *,
    overrides: Sequence[str] = (),
    resume: bool = False,
) -> RunResult:
    """Run (or ``resume``) a training run in this process; the ablation runner's entry point.

    Under ``torchrun`` every rank calls it; each returns the same (global) metric history.
    """
    recipe = GRPORecipe(resolve_config(config, overrides), resume=resume)
    try:
        result = recipe.run()
    except BaseException:
        recipe.close(clean=False)
        raise
    recipe.close()
    return result
