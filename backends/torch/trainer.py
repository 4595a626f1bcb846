"""The GRPO recipe: one readable loop, components imported (torchtune style).

One step (``train_step``), identical on every rank for its shard of the step's prompts;
each phase's inputs and outputs are named in its signature (``backends.torch.step``):

1. ``rollout(prompts, ...) -> RolloutBatch``: G responses per prompt, each generate call
   under a derived seed;
2. ``signals(batch, pool) -> StepSignals``: the credit (``backends.torch.credit``,
   ``CreditPath``): rewards, advantages, old/reference log-probs with only the signals the
   strategy reads, then the run's one ``CreditRun.apply``;
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from adapters.policy import (
    response_logprobs_and_stats,
)
from backends.common.data import Prompt, PromptSampler, shard
from backends.common.errors import ConfigError
from backends.common.preemption import PreemptionWatch, signal_name
from backends.torch import checkpoint as ckpt
from backends.torch.answer_span import build_answer_span
from backends.torch.config import (
    TrainConfig,
    check_batch_split,
    config_from_dict,
    dump_config,
    load_config,
)
from backends.torch.credit import CreditPath, credit_plan, prompt_labels
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
    CreditStrategy,
)

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
        plan = credit_plan(cfg.credit)  # the run's one strategy and the signals it reads
        prm_spec = plan.trained_model
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
            grad_points=plan.reward_grad_points,
        )
        # algorithm.estimator gae: the critic, copied from the policy before FSDP shards it
        critic = build_critic(self.policy.model, seed=cfg.seed) if self._gae else None
        span = cfg.data.answer_span
        answer_span = (
            None
            if span is None
            else build_answer_span(span, self.policy.tokenizer, self.policy.eos_ids)
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
        #: the run's credit: its one strategy, the ``CreditRun`` (and gate), what it reads
        self.credit = CreditPath(
            cfg,
            self.ctx,
            plan,
            self.reward,
            answer_span=answer_span,
            ref_model=self.ref_model,
            prm=self.prm,
            critic=self.critic,
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
        if self.credit.run.gate is not None:
            self.credit.run.load_state_dict(state.trainer[CREDIT_KEY])
        self.credit.strategy.load_state_dict(state.rank["strategy"])
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
                    {CREDIT_KEY: self.credit.run.state_dict()}
                    if self.credit.run.gate is not None
                    else {}
                ),
            },
            rank={
                "rng": ckpt.capture_rng(self.ctx.device),
                "strategy": self.credit.strategy.state_dict(),
            },
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

    def signals(
        self,
        batch: RolloutBatch,
        pool: Sequence[Prompt],
        *,
        strategy: CreditStrategy | None = None,
        rewards: RolloutRewards | None = None,
        advance: bool = False,
    ) -> StepSignals:
        """The credit phase of ``batch`` at the current policy and step
        (``CreditPath.signals``; ``strategy`` and ``rewards`` replace the run's own for a
        look, ``advance`` for the training step's batch)."""
        return self.credit.signals(
            self.model,
            batch,
            pool,
            step=self.step,
            strategy=strategy,
            rewards=rewards,
            advance=advance,
        )

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

    def next_rollout(self) -> RolloutBatch:
        """This rank's responses to the sampler's next training prompts, sampled as a
        training step samples them at the current ``step`` (``train_step`` advances ``step``
        first; a look that is no training step calls this directly)."""
        prompts, positions, groups = self._my_prompts(self.sampler.next_batch(), self.train_prompts)
        return self.rollout(
            prompts,
            positions,
            groups,
            group_size=self.cfg.rollout.group_size,
            greedy=False,
            tag="rollout",
        )

    def train_step(self) -> dict[str, float]:
        """One GRPO step on the next prompts; returns the step's (global) metrics."""
        cfg = self.cfg
        self.step += 1
        clock = PhaseClock(self.ctx.device)
        batch = self.next_rollout()
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
                labels=prompt_labels(batch, self.eval_prompts),
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
        the run folder's lock. Without a process group no reference cycle is left: the last
        reference to the recipe dropped frees it and every model it holds, so only a
        distributed run pays for a full garbage collection.

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
            "samples",  # its recorder calls back ``self.signals``: the one cycle through self
        ):
            self.__dict__.pop(name, None)
        if self.ctx.active:  # the DDP/FSDP wrappers' reference cycles go before the group
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
