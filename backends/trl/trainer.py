"""``CreditGRPOTrainer``: TRL's ``GRPOTrainer`` with token advantages from ``credit_core``.

TRL computes the response advantages A (B,) in ``_generate_and_score_completions`` and its
loss multiplies the importance ratio by ``inputs["advantages"]``, accepting a (B, T) tensor.
This subclass replaces A by the token advantages of the run's credit (0 at padding;
``backends.trl.credit.TrlCredit`` on ``backends.common.credit.CreditRun``), computing only
the signals the strategy reads (``signals_to_compute``; the reward gradient is always known
before the policy statistics are reduced, so a strategy with ``work_requires``, the DATC
family, gets DATC's unsigned work W0 streamed in two matmuls per vocabulary tile instead of
``PolicyStats``):

- reward side (``reward_grad`` (B, T, d), ``reward_attention`` (B, T), ``prefix_rewards``
  (B, T)): one scoring pass of the direction model at generation time, asking only for
  what is read; with grad enabled when the gradient is read (TRL's reward functions return
  scalars and run model rewards under ``torch.inference_mode()``), without otherwise.
- policy side (``policy_stats`` or ``unsigned_work`` from the final hidden states,
  ``token_entropy`` from TRL's fused LM head, which computes the entropy at TRL's
  temperature in every forward): from a policy forward TRL already takes, at the parameters
  that sampled the batch, with no extra forward:

  * where TRL takes an old-log-prob forward (``num_iterations > 1``, gradient accumulation
    across generations, vLLM importance correction), from that forward, at generation time
    (for the whole generation batch);
  * otherwise (the default on-policy setup) from the loss forward of each micro-batch, whose
    parameters are still those that sampled it: the signals are taken without grad, and the
    token advantages are formed before TRL's loss reads them
    (``_get_per_token_logps_and_entropies`` runs before that read).

A path-gradient strategy (``reward_grad_points`` >= 1: ``datc_mid``, ``datc_ig``) takes its
reward gradient on the path to the policy's expected embeddings m1, which the same policy
forward gives: there the order is reversed, ``PolicyStats`` first (m1 among them), then the
path gradient (``adapters.grad_path.path_reward_grad``: ``points`` RM forward + backward
passes, no RM forward at the samples, whose reward TRL's reward functions give), at
generation time or in each loss step, with no policy forward of its own.

Strategies that read no policy-side signal get their token advantages at generation time;
so do those that read the step's rewards and groups (``step_groups``: TRL's consecutive
blocks of ``num_generations``, known before the loss phase shuffles the rows), ``process``
among them, whose token rewards TRL's own reward functions return
(``backends.trl.token_rewards``: TRL gets each completion's outcome, the credit the rest).
A strategy that selects tokens batch-wide (``entropy_top``, ``random_top``) takes its
quantile over the batch the advantages are formed for, joined over every process
(``backends.trl.credit.process_gather``). The credit diagnostics go to TRL's metrics as
``credit/...``; for a strategy that reads a direction model, so does the model's agreement
with TRL's reward on each generation batch (``credit/direction_agreement``, or
``credit/direction_is_reward``; ``_measure``), which a ``credit.gate`` mixes by.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Literal, overload

import torch
from transformers import PreTrainedModel
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl.trainer.grpo_trainer import GRPOTrainer
from trl.trainer.utils import is_async_callable

from adapters.config import build_direction_model
from adapters.direction import AgreeCount, DirectionModel, EmbeddingDirectionModel
from adapters.grad_path import path_alphas, path_model, path_reward_grad
from adapters.partitioned import holds_zero3_params
from adapters.reward_models import SeqClassificationRM
from backends.common.credit import AgreementMetrics
from backends.trl.capture import HiddenCapture, lm_head
from backends.trl.config import CreditGRPOConfig
from backends.trl.credit import TrlCredit
from backends.trl.credit_samples import (
    REWARDS_KEY,
    TrlSampleRecorder,
    compared_signals,
    compared_strategies,
)
from backends.trl.reward_pass import GradientRewardModel, completion_reward_grad, fill_unmatched
from backends.trl.rewards import DirectionReward
from backends.trl.token_rewards import TokenRewardFunction, step_token_rewards
from backends.trl.version import check_trl_version
from credit_core import (
    CreditError,
    CreditSignals,
    CreditStrategy,
    PolicyStats,
    TokenRewards,
    policy_stats,
    unsigned_work,
)
from credit_core.plan import CreditPlan

#: The reward-side signals: the ``RewardOutput`` field that holds each, and the
#: ``DirectionModel.score`` option that asks for it.
REWARD_SIDE: dict[str, tuple[str, str]] = {
    "reward_grad": ("reward_grad", "with_grad"),
    "reward_attention": ("attention", "with_attention"),
    "prefix_rewards": ("prefix_rewards", "with_prefix_rewards"),
}

#: Prefix of the keys of the inputs dict that carry the reward-side signals from generation
#: to the loss step (``credit_reward_grad``, ...; TRL shuffles and splits every tensor of that
#: dict along dim 0).
CARRY_PREFIX = "credit_"

#: Key of ``score_rewards``' answer that holds the direction model's own reward of each row
#: (B,), when asked for (its agreement with TRL's reward; ``backends.trl.credit``).
DIRECTION_SCORES = "direction_scores"

#: Where the token advantages are formed: at generation time, or in each loss step.
CreditPhase = Literal["generation", "loss"]


@dataclass(frozen=True)
class PolicyForward:
    """What a policy forward TRL runs hands to the credit (all detached):

    - ``token_ids`` (B, T): the completion tokens.
    - ``hidden`` (B, T, H) or None: the final hidden states at the positions that predict
      them; recorded only when policy statistics are read.
    - ``entropy`` (B, T) float32 or None: TRL's fused-head entropy of p_t at TRL's
      temperature (0 at masked positions); kept only when ``token_entropy`` is read.
    """

    token_ids: torch.Tensor
    hidden: torch.Tensor | None
    entropy: torch.Tensor | None


#: Takes the ``PolicyForward`` of the next policy forward TRL runs.
ForwardConsumer = Callable[[PolicyForward], None]


def process_max(accelerator: Any) -> AgreeCount:
    """The largest of every process's count (one gather of ``accelerator``'s processes per
    call, on its device: NCCL takes no CPU tensor)."""

    def agree(count: int) -> int:
        mine = torch.tensor([count], dtype=torch.long, device=accelerator.device)
        return int(accelerator.gather(mine).max())

    return agree


class CreditGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` whose loss gets (B, T) token advantages from ``args.credit``.

    Takes ``GRPOTrainer``'s arguments, ``args`` a ``CreditGRPOConfig``, plus
    ``direction_model`` (an ``adapters.direction.DirectionModel`` in the policy's vocabulary).
    When the strategy reads a signal of the direction model and none is given, it is built
    from ``args.direction``, else from the first reward model among ``reward_funcs`` (so
    ``credit: datc`` alone is enough for a TRL run with a reward model). A strategy that
    reads ``reward_attention`` is refused (``CreditError`` naming ``direction``) when the
    direction model gives none (``gives_attention`` False).
    ``credit_phase`` says where the token advantages are formed (see the module docstring).
    """

    def __init__(
        self,
        model: Any,
        reward_funcs: Any = None,
        args: CreditGRPOConfig | None = None,
        *trainer_args: Any,
        direction_model: DirectionModel | None = None,
        **trainer_kwargs: Any,
    ) -> None:
        check_trl_version()
        if not isinstance(args, CreditGRPOConfig):
            raise TypeError(
                f"args: expected a backends.trl.CreditGRPOConfig, got {type(args).__name__}"
            )
        super().__init__(model, reward_funcs, args, *trainer_args, **trainer_kwargs)
        self.credit_args: CreditGRPOConfig = args
        self.policy: torch.nn.Module = self.model  # type: ignore[assignment]
        #: the run's credit plan (``CreditGRPOConfig.credit_plan``: the strategy, built once)
        self.plan: CreditPlan = args.credit_plan
        self.strategy: CreditStrategy = self.plan.strategy
        #: TRL's reward functions that may return token rewards, with their weights (only
        #: where the strategy reads them: ``TokenRewardFunction`` in TRL's list)
        self.token_reward_functions = (
            self._token_reward_functions() if self.plan.reads_token_rewards else []
        )
        #: the reward gradient is taken on the path to the policy's m1 (datc_mid, datc_ig)
        self.path = self.plan.path
        # the reward gradient is known before the statistics are reduced, except on the path
        self.reads = self.plan.signals
        self.needs_reward_grad = self.plan.needs_reward_grad
        #: the reward-side signals carried to the loss step: the scored ones and P2T's r_t
        self.attributes = "reward_attribution" in self.reads
        self.needs_policy_stats = self.plan.reads_sampled_distribution
        self.needs_entropy = "token_entropy" in self.reads
        #: the reward-side signals the direction model's scoring pass gives (``REWARD_SIDE``)
        gradient = frozenset({"reward_grad"} if self.needs_reward_grad else ())
        self.scored = gradient | (self.reads & {"reward_attention", "prefix_rewards"})
        self.direction: DirectionModel | None = None
        if self.scored or self.needs_policy_stats:
            self.direction = direction_model or self._build_direction(args)
            self._check_direction_gives(self.direction)
        if self.attributes:
            assert self.direction is not None  # built above: the strategy reads reward_grad
            try:
                self.direction.null_embedding(self.strategy.attribution_null)
            except CreditError as err:
                raise CreditError(
                    f"credit: strategy {self.strategy.name!r} reads reward_attribution: {err}"
                ) from err
        #: which of TRL's reward functions is the direction model's own reward (None: the
        #: direction model is a model of its own, its scores come from its own pass)
        self.direction_column = self._direction_column(direction_model, args)
        #: TRL's reward model giving DATC's gradient from its own reward pass, when shared
        self.reward_pass = self._share_reward_pass(direction_model, args)
        #: set where the direction model's forwards are collectives (``collective_agreement``)
        self._agree_count = self.collective_agreement(self.direction)
        #: the path positions of a path-gradient strategy (none for the others)
        self.alphas: list[float] = []
        if self.path:
            self.direction = path_model(self.direction)
            self.alphas = path_alphas(self.strategy.reward_grad_points)
        self.needs_policy_forward = self.needs_policy_stats or self.needs_entropy
        self.credit_phase: CreditPhase = (
            "loss"
            if self.needs_policy_forward and not self.takes_old_logp_forward
            else "generation"
        )
        if self.plan.reads_groups and self.credit_phase == "loss":
            raise CreditError(
                f"credit: strategy {self.strategy.name!r} reads the step's groups, which TRL "
                "knows only at generation time, and a policy-side signal formed in the loss step"
            )
        self._capture = HiddenCapture(self.policy) if self.needs_policy_stats else None
        self._on_forward: ForwardConsumer | None = None
        self._old_forward: PolicyForward | None = None
        self.samples = self._build_recorder(args)
        self._local_rewards: torch.Tensor | None = None
        #: the run's credit: its ``CreditRun`` (the plan's one strategy, the gate) and the
        #: compared strategies' runs, the gather over processes, the logging
        self.credit = TrlCredit(
            self.plan,
            args.credit_config.gate,
            [] if self.samples is None else self.samples.compare,
            self.accelerator,
            direction_is_reward=self.direction_column is not None and len(self.reward_funcs) == 1,
        )
        if self.plan.reads_groups:  # refused at start-up rather than at the first step
            steps = args.steps_per_generation
            assert steps is not None  # GRPOConfig.__post_init__ sets it
            rows = args.per_device_train_batch_size * steps
            self.credit.check_whole_groups(rows, int(self.num_generations or 1))
        #: the direction model's own pass gives the scores its agreement is measured by
        self.own_scores = (
            self.credit.run.measures
            and not self.credit.run.direction_is_reward
            and self.direction_column is None
        )
        #: the step's rewards (every process's rows) as TRL's ``_calculate_rewards`` gave
        #: them, and the direction model's column among them, until the step takes them
        self._step_rewards: tuple[torch.Tensor, torch.Tensor | None] | None = None
        #: the last training generation batch's agreement (None: the strategy reads none)
        self._agreement: AgreementMetrics | None = None

    # ------------------------------------------------------------------------------ setup

    @property
    def takes_old_logp_forward(self) -> bool:
        """Whether TRL runs an old-policy log-prob forward at generation time (its own rule in
        ``_generate_and_score_completions``): the loss forward's parameters then differ from
        the sampling ones, or vLLM sampled the batch."""
        steps = self.credit_args.steps_per_generation
        assert steps is not None  # GRPOConfig.__post_init__ sets it
        generate_every = steps * self.num_iterations
        return bool(
            self.args.gradient_accumulation_steps % generate_every != 0
            or (self.use_vllm and self.vllm_importance_sampling_correction)
        )

    def _token_reward_functions(self) -> list[tuple[float, TokenRewardFunction]]:
        """Each plain reward function of TRL's list (synchronous, not a model) replaced by a
        ``TokenRewardFunction`` of it, with its weight; ``CreditError`` naming
        ``reward_funcs`` when there is none (a model or an async function gives one number
        per completion)."""
        found = []
        weights = self.reward_weights.tolist()
        funcs: list[Any] = self.reward_funcs  # TRL built any model named by a string
        for i, func in enumerate(funcs):
            if isinstance(func, torch.nn.Module) or is_async_callable(func):
                continue
            wrapped = TokenRewardFunction(func, self.reward_func_names[i])
            funcs[i] = wrapped
            found.append((float(weights[i]), wrapped))
        if not found:
            raise CreditError(
                f"reward_funcs: strategy {self.strategy.name!r} reads token rewards, which a "
                "synchronous reward function returns (a list per completion); TRL's reward "
                "functions here are models or async functions (one number per completion)"
            )
        return found

    def _build_recorder(self, args: CreditGRPOConfig) -> TrlSampleRecorder | None:
        """The credit-samples recorder of ``args`` (None when ``credit_samples_steps`` is 0)."""
        interval = args.credit_samples_steps
        if interval is None:
            interval = int(args.logging_steps)
        if interval == 0:
            return None
        own = args.credit_config.label
        compare = compared_strategies(self.plan, own, args.compare_plans)
        return TrlSampleRecorder(
            interval=interval,
            count=args.credit_samples_count,
            own=own,
            compare=compare,
            tokenizer=self._tokenizer,
            output_dir=str(args.output_dir),
            enabled=self.accelerator.is_main_process,
            tensorboard=self._tensorboard_writer,
        )

    def _tensorboard_writer(self) -> Any:
        """TRL's TensorBoard writer (``report_to`` with tensorboard, once training began), or
        None."""
        from transformers.integrations.integration_utils import TensorBoardCallback

        for callback in self.callback_handler.callbacks:
            if isinstance(callback, TensorBoardCallback):
                return callback.tb_writer
        return None

    def _build_direction(self, args: CreditGRPOConfig) -> DirectionModel:
        """``args.direction`` built for this policy; without it, the first reward model among
        TRL's ``reward_funcs`` (a one-label sequence classifier, weights shared)."""
        with lm_head(self.policy) as (weight, _):
            vocab = int(weight.shape[0])
        cfg = args.direction_config
        if cfg is not None:
            return build_direction_model(
                cfg, self._tokenizer, device=self.accelerator.device, policy_vocab_size=vocab
            )
        found = self._reward_model()
        if found is not None:
            index, model = found
            rm_tokenizer = self.reward_processing_classes[index]
            return SeqClassificationRM(
                model, rm_tokenizer, self._tokenizer, policy_vocab_size=vocab
            )
        raise CreditError(
            f"direction: strategy {self.strategy.name!r} reads "
            f"{sorted(self.strategy.requires)}, which needs a differentiable reward model: "
            "set direction (e.g. {kind: seq_classification, path: ...}), give TRL a reward "
            "model in reward_funcs, or pass direction_model= to CreditGRPOTrainer"
        )

    def _reward_model(self) -> tuple[int, PreTrainedModel] | None:
        """The first reward model among TRL's ``reward_funcs`` (a ``PreTrainedModel``, or
        the DeepSpeed engine holding one as ``.module``) and its position, or None."""
        for i, func in enumerate(self.reward_funcs):
            model = getattr(func, "module", func)
            if isinstance(model, PreTrainedModel):
                return i, model
        return None

    def _direction_column(self, given: DirectionModel | None, args: CreditGRPOConfig) -> int | None:
        """The position among TRL's ``reward_funcs`` of the direction model's own reward:
        the reward model the direction model was built from (no ``direction``, no
        ``direction_model``), or a ``DirectionReward`` of the given ``direction_model``;
        None when there is no direction model or it is none of TRL's rewards."""
        if self.direction is None:
            return None
        if given is None and args.direction_config is None:
            found = self._reward_model()
            return None if found is None else found[0]
        for i, func in enumerate(self.reward_funcs):
            if isinstance(func, DirectionReward) and func.direction is given:
                return i
        return None

    def _share_reward_pass(
        self, given: DirectionModel | None, args: CreditGRPOConfig
    ) -> GradientRewardModel | None:
        """Where the direction model was built from TRL's reward model (no ``direction``,
        no ``direction_model``) with the policy's own tokenizer, and the strategy reads the
        gradient at the sampled tokens and no other reward-side signal: that reward model,
        replaced in ``reward_funcs`` by a ``GradientRewardModel`` that gives TRL its reward
        and the credit its gradient from one pass. None otherwise (two passes)."""
        found = self._reward_model()
        if (
            given is not None
            or args.direction_config is not None
            or found is None
            or self.path
            or self.scored != {"reward_grad"}
            or not isinstance(self.direction, SeqClassificationRM)
            or not self.direction.identical_vocab
        ):
            return None
        index, _ = found
        func: Any = self.reward_funcs[index]
        shared = GradientRewardModel(func)
        self.reward_funcs[index] = shared
        return shared

    def collective_agreement(self, direction: DirectionModel | None) -> AgreeCount | None:
        """Where ``direction`` holds ZeRO-3 parameters (built from TRL's reward model under
        ZeRO-3) and several processes run, each of its forwards is a collective: the count
        agreement ``process_max`` of this trainer's processes, also set as the direction
        model's own ``agree_count`` (its prefix passes); None otherwise (a direction model
        of its own is whole on every process: ``adapters.config.build_direction_model``)."""
        if (
            self.accelerator.num_processes == 1
            or not isinstance(direction, EmbeddingDirectionModel)
            or not holds_zero3_params(direction.modules)
        ):
            return None
        agree = process_max(self.accelerator)
        direction.agree_count = agree
        return agree

    def _check_direction_gives(self, direction: DirectionModel) -> None:
        """``CreditError`` naming ``direction`` when the strategy reads the direction model's
        attention (``reward_attention``) and ``direction`` gives none
        (``CreditPlan.direction_problem``)."""
        problem = self.plan.direction_problem(
            "direction",
            type(direction).__name__,
            gives_attention=direction.gives_attention,
            path_problem=None,  # path_model(direction) refuses a model without a path
        )
        if problem is not None:
            raise CreditError(str(problem))

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """TRL's checkpoint, plus the credit's state (``TrlCredit.save``: the strategy's
        random streams, the gate's EMA) in the same folder."""
        super()._save_checkpoint(model, trial)  # type: ignore[no-untyped-call]
        folder = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        path = os.path.join(self._get_output_dir(trial=trial), folder)
        self.credit.save(path, should_save=self.args.should_save)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """TRL's resume, plus the credit's state saved by ``_save_checkpoint``."""
        super()._load_optimizer_and_scheduler(checkpoint)  # type: ignore[no-untyped-call]
        if checkpoint is not None:
            self.credit.load(checkpoint)

    # -------------------------------------------------------------------------- signals

    def _get_per_token_logps_and_entropies(
        self,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        logits_to_keep: int,
        batch_size: int | None = None,
        compute_entropy: bool = False,
        **kwargs: Any,
    ) -> Any:
        """TRL's forward. When a consumer waits for it (``_on_forward``), this forward's
        ``PolicyForward`` is handed over: the final hidden states (recorded when policy
        statistics are read) and the entropies TRL's fused head computes in every forward
        (kept when ``token_entropy`` is read; TRL's caller gets them only if it asked)."""
        consumer, self._on_forward = self._on_forward, None
        forward = super()._get_per_token_logps_and_entropies
        if consumer is None:
            return forward(
                model,
                input_ids,
                attention_mask,
                logits_to_keep,
                batch_size=batch_size,
                compute_entropy=compute_entropy,
                **kwargs,
            )
        recording: AbstractContextManager[list[torch.Tensor]] = (
            self._capture.recording() if self._capture is not None else nullcontext([])
        )
        with recording as chunks:
            logps, entropies, *rest = forward(
                model,
                input_ids,
                attention_mask,
                logits_to_keep,
                batch_size=batch_size,
                compute_entropy=compute_entropy or self.needs_entropy,
                **kwargs,
            )
        hidden = None
        if self._capture is not None:
            # hidden state j predicts token j + 1: completion tokens are predicted by -T-1 .. -2
            hidden = torch.cat(chunks)[:, -logits_to_keep - 1 : -1].detach()
        entropy = entropies.detach().float() if self.needs_entropy else None
        consumer(PolicyForward(input_ids[:, -logits_to_keep:], hidden, entropy))
        return (logps, entropies if compute_entropy else None, *rest)

    def credit_signals(
        self,
        scored: Mapping[str, torch.Tensor],
        forward: PolicyForward | None = None,
        stats: PolicyStats | None = None,
        token_rewards: TokenRewards | None = None,
    ) -> CreditSignals:
        """The signals the strategy reads (``self.reads``): the reward-side ones from
        ``scored`` (``score_rewards``), and from a policy ``forward``: its entropy, and,
        from its hidden states, DATC's W0 (streamed with ``scored["reward_grad"]``) or
        ``PolicyStats`` (``stats`` when already reduced from this forward); the reward
        functions' ``token_rewards`` (``step_token_rewards``) where given."""
        found: dict[str, Any] = {name: scored[name] for name in REWARD_SIDE if name in self.reads}
        if token_rewards is not None:
            found["token_rewards"] = token_rewards
        if self.attributes:
            found["reward_attribution"] = scored["reward_attribution"]
        if forward is None:
            return CreditSignals(**found)
        if self.needs_entropy:
            found["token_entropy"] = forward.entropy
        if not self.needs_policy_stats:
            return CreditSignals(**found)
        if "unsigned_work" in self.reads:
            found["unsigned_work"] = self._reduced(forward, scored["reward_grad"])
        else:
            found["policy_stats"] = stats if stats is not None else self._reduced(forward)
        return CreditSignals(**found)

    @overload
    def _reduced(self, forward: PolicyForward) -> PolicyStats: ...
    @overload
    def _reduced(self, forward: PolicyForward, reward_grad: torch.Tensor) -> torch.Tensor: ...

    @torch.no_grad()
    def _reduced(
        self, forward: PolicyForward, reward_grad: torch.Tensor | None = None
    ) -> PolicyStats | torch.Tensor:
        """From ``forward``'s hidden states, at TRL's temperature, streamed over the LM head:
        DATC's W0 (B, T) with ``reward_grad`` (B, T, d), else ``PolicyStats``."""
        assert self.direction is not None and forward.hidden is not None
        h = forward.hidden.float() if self.credit_args.cast_lm_head_to_fp32 else forward.hidden
        kw: dict[str, Any] = {
            "temperature": self.temperature,
            "chunk_size": self.credit_args.section.chunk_size,
        }
        E = self.direction.reward_embedding
        ids = forward.token_ids
        with lm_head(self.policy) as (weight, bias):
            if reward_grad is not None:
                return unsigned_work(h, weight, ids, E, reward_grad, lm_head_bias=bias, **kw)
            return policy_stats(h, weight, ids, E, lm_head_bias=bias, **kw)

    def score_on_path(
        self, batch: dict[str, Any], forward: PolicyForward
    ) -> tuple[dict[str, torch.Tensor], PolicyStats]:
        """A path-gradient strategy's signals of ``batch``: ``PolicyStats`` of ``forward``
        (the policy forward TRL took at the sampling parameters), then ``reward_grad``
        (B, T, d) float32, dR/dx averaged over x(a) = E[y] + a (m1 - E[y]) for a in
        ``self.alphas`` (0 at padding), one chunk of TRL's per-device batch size at a time,
        and the other reward-side signals read (``score_rewards``)."""
        stats = self._reduced(forward)
        model = path_model(self.direction)
        grads = []
        for rows in self._score_chunks(stats.m1.shape[0]):
            grad = path_reward_grad(
                model,
                batch["prompt_ids"][rows],
                batch["prompt_mask"][rows],
                batch["completion_ids"][rows],
                batch["completion_mask"][rows],
                stats.m1[rows],
                self.alphas,
            )
            grads.append(grad.detach().float())  # 0 at padding (path_reward_grad)
        scored = self.score_rewards(batch, self.scored - {"reward_grad"})
        scored["reward_grad"] = torch.cat(grads)
        return scored, stats

    def _score_chunks(self, n: int) -> list[slice]:
        """The rows of each scoring call over ``n`` rows: TRL's per-device batch size."""
        size = (
            self.args.per_device_train_batch_size
            if self.policy.training
            else self.args.per_device_eval_batch_size
        )
        return [slice(start, start + size) for start in range(0, n, size)]

    def score_rewards(
        self, batch: dict[str, Any], names: frozenset[str] | None = None, *, scores: bool = False
    ) -> dict[str, torch.Tensor]:
        """The reward-side signals ``names`` (default ``self.scored``) of ``batch`` (TRL's
        generation output):
        ``reward_grad`` (B, T, d) dR / d(RM input embedding), ``reward_attention`` and
        ``prefix_rewards`` (B, T), at its completion tokens, from ONE scoring pass of the
        direction model per chunk of TRL's per-device batch size, with grad only when the
        gradient is read. Only the options asked for are passed to ``score`` (a direction
        model written before ``with_attention``/``with_prefix_rewards`` keeps working for
        the strategies that read neither). With ``scores``, also the direction model's
        reward of each row (B,) float32 under ``DIRECTION_SCORES`` (from the same pass; a
        pass without grad when no signal is asked for)."""
        names = self.scored if names is None else names
        if not names and not scores:
            return {}
        assert self.direction is not None
        with_grad = "reward_grad" in names
        options = {REWARD_SIDE[name][1]: True for name in names if name != "reward_grad"}
        parts: dict[str, list[torch.Tensor]] = {name: [] for name in names}
        own: list[torch.Tensor] = []
        with torch.enable_grad() if with_grad else torch.no_grad():
            for rows in self._score_chunks(batch["completion_ids"].shape[0]):
                out = self.direction.score(
                    batch["prompt_ids"][rows],
                    batch["prompt_mask"][rows],
                    batch["completion_ids"][rows],
                    batch["completion_mask"][rows],
                    with_grad=with_grad,
                    **options,
                )
                for name, chunks in parts.items():
                    field, option = REWARD_SIDE[name]
                    value = getattr(out, field)
                    if value is None:
                        raise CreditError(
                            f"direction: {type(self.direction).__name__}.score({option}=True) "
                            f"returned no {field}"
                        )
                    chunks.append(value.detach())
                own.append(out.rewards.detach().float())
        found = {name: torch.cat(chunks) for name, chunks in parts.items()}
        if scores:
            found[DIRECTION_SCORES] = torch.cat(own)
        return found

    # --------------------------------------------------------------------------- credit

    def _calculate_rewards(self, inputs: Any, prompts: Any, *args: Any) -> torch.Tensor:
        """TRL's rewards of every reward function (all processes' rows). Keeps, for the
        direction model's agreement, the step's reward (TRL's weighted sum, NaN where every
        function returned None, as TRL's advantage takes it) and the direction model's own
        column (``direction_column``), and this process's rows' weighted sum (0 where every
        function returned None) for the credit samples and a strategy that reads the step's
        groups."""
        per_func: torch.Tensor = super()._calculate_rewards(inputs, prompts, *args)
        weights = self.reward_weights.to(per_func.device).unsqueeze(0)
        summed = (per_func * weights).nansum(dim=1)
        if self.credit.run.measures:
            rewards = torch.where(torch.isnan(per_func).all(dim=1), torch.nan, summed)
            column = self.direction_column
            self._step_rewards = (rewards, None if column is None else per_func[:, column])
        if self.samples is not None or self.plan.reads_groups:
            start = self.accelerator.process_index * len(prompts)
            self._local_rewards = summed[start : start + len(prompts)]
        return per_func

    def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
        """TRL's generation batch with ``advantages`` (B, T) where credit is formed at
        generation time; in the loss phase, with the reward-side signals (if any) attached
        under ``CARRY_PREFIX``; with the rows' rewards attached when credit samples are
        recorded."""
        old_forward = self.needs_policy_forward and self.credit_phase == "generation"
        if old_forward:
            self._on_forward = self._keep_old_forward
        try:
            output: dict[str, Any] = super()._generate_and_score_completions(inputs)
        except BaseException:
            if self.reward_pass is not None:
                self.reward_pass.discard()
            raise
        finally:
            pending, self._on_forward = self._on_forward, None
        local, self._local_rewards = self._local_rewards, None
        if self.samples is not None and local is not None:
            output[REWARDS_KEY] = local
        if old_forward and (pending is not None or "old_per_token_logps" not in output):
            raise RuntimeError(
                "CreditGRPOTrainer: TRL took no old-log-prob forward where TRL 1.16 takes one; "
                "the policy-side signals are missing (is the installed TRL the supported one?)"
            )
        # a path strategy scores after its policy forward (score_on_path), the others here
        scored = {} if self.path else self.reward_side(output)
        self._measure(output, scored.pop(DIRECTION_SCORES, None))
        if self.credit_phase == "loss":
            for name, value in scored.items():
                output[CARRY_PREFIX + name] = value
            return output
        old, self._old_forward = self._old_forward, None
        stats = None
        if self.path:
            assert old is not None  # a path strategy reads PolicyStats: TRL's forward was kept
            scored, stats = self.score_on_path(output, old)
        token_rewards = self.step_token_rewards(output) if self.token_reward_functions else None
        groups = self.step_groups(output, local) if self.plan.reads_groups else None
        output["advantages"] = self.token_advantages(
            output, self.credit_signals(scored, old, stats, token_rewards), groups
        )
        return output

    def step_token_rewards(self, batch: dict[str, Any]) -> TokenRewards:
        """The token rewards (B, T) TRL's reward functions gave ``batch`` (this process's
        rows, TRL's completion tensors), within its loss mask (``step_token_rewards``)."""
        return step_token_rewards(self.token_reward_functions, self.loss_mask(batch))

    def step_groups(
        self, batch: dict[str, Any], rewards: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(rewards (B,), groups (B,) int64) of this process's B rows of ``batch`` at
        generation time: TRL's reward (``_calculate_rewards``' weighted sum) and TRL's groups
        (consecutive blocks of ``num_generations`` over every process's rows,
        ``TrlCredit.groups``)."""
        assert rewards is not None  # kept by _calculate_rewards when the plan reads groups
        training = bool(self.policy.training)
        size = int((self.num_generations if training else self.num_generations_eval) or 1)
        rows = int(batch["completion_ids"].shape[0])
        return rewards.to(batch["completion_ids"].device), self.credit.groups(rows, size)

    def _measure(self, batch: dict[str, Any], scores: torch.Tensor | None) -> None:
        """The direction model's agreement with TRL's reward on this generation batch (every
        process's rows, TRL's groups; ``TrlCredit.measure``), logged into TRL's metrics; a
        training batch advances the gate's EMA, before any of its token advantages are
        formed. ``scores`` (B,): this process's rows' direction scores from the scoring
        pass that gave the signals; a path strategy with a direction model of its own,
        whose path passes score no sample, takes them from one pass without grad here."""
        step, self._step_rewards = self._step_rewards, None
        if not self.credit.run.measures:
            return
        training = bool(self.policy.training)
        all_scores = None
        if self.own_scores:
            if scores is None:
                scores = self.score_rewards(batch, frozenset(), scores=True)[DIRECTION_SCORES]
            all_scores = self.accelerator.gather(scores.float().to(self.accelerator.device))
        elif step is not None:
            all_scores = step[1]
        agreement = self.credit.measure(
            all_scores,
            None if step is None else step[0],
            int((self.num_generations if training else self.num_generations_eval) or 1),
            advance=training,
        )
        self.credit.log_agreement(self._metrics["train" if training else "eval"], agreement)
        if training:
            self._agreement = agreement  # the recorded credit samples show it

    def reward_side(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        """The reward-side signals of ``batch`` (TRL's generation output), plus P2T's
        ``reward_attribution`` (B, T) from their ``reward_grad`` when the strategy reads it
        (``DirectionModel.attribution``: no further reward pass)."""
        scored = self._reward_side(batch)
        if self.attributes:
            assert self.direction is not None  # built in __init__
            scored["reward_attribution"] = self.direction.attribution(
                scored["reward_grad"],
                batch["completion_ids"],
                batch["completion_mask"],
                self.strategy.attribution_null,
            )
        return scored

    def _reward_side(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        """``score_rewards``; with a shared reward pass (``reward_pass``), ``reward_grad``
        from the pass TRL just made for its reward, moved to the completion tokens, and from
        the direction model's own pass only for the rows it cannot place (their share is
        logged as ``credit/reward_grad_second_pass_frac``)."""
        if self.reward_pass is None:
            return self.score_rewards(batch, scores=self.own_scores)
        special = torch.tensor(self._tokenizer.all_special_ids, dtype=torch.long)
        grad, matched = completion_reward_grad(
            self.reward_pass.take(), batch["completion_ids"], batch["completion_mask"], special
        )
        missing = fill_unmatched(
            grad,
            matched,
            batch,
            lambda rows: self.score_rewards(rows)["reward_grad"],
            self._agree_count,
        )
        mode = "train" if self.policy.training else "eval"
        share = missing / max(1, matched.numel())
        self._metrics[mode]["credit/reward_grad_second_pass_frac"].append(share)
        return {"reward_grad": grad}

    def _keep_old_forward(self, forward: PolicyForward) -> None:
        self._old_forward = forward

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        """TRL's loss; in the loss phase the token advantages are formed from this step's
        loss forward (between the forward and TRL's read of ``advantages``); a path-gradient
        strategy's reward-side signals are scored there too, after that forward."""
        if self.credit_phase != "loss":
            return super()._compute_loss(model, inputs)  # type: ignore[no-any-return,no-untyped-call]
        batch = dict(inputs)  # the buffered generation batch keeps its (B,) advantages
        carried = {} if self.path else self.scored | ({"reward_attribution"} & self.reads)
        scored = {name: batch.pop(CARRY_PREFIX + name) for name in carried}

        def form_credit(forward: PolicyForward) -> None:
            stats = None
            if self.path:
                now, stats = self.score_on_path(batch, forward)
                scored.update(now)
            batch["advantages"] = self.token_advantages(
                batch, self.credit_signals(scored, forward, stats)
            )

        self._on_forward = form_credit
        try:
            loss: torch.Tensor = super()._compute_loss(model, batch)  # type: ignore[no-untyped-call]
        finally:
            pending, self._on_forward = self._on_forward, None
        if pending is not None:
            raise RuntimeError("CreditGRPOTrainer: TRL's loss took no policy forward")
        return loss

    @staticmethod
    def loss_mask(batch: dict[str, Any]) -> torch.Tensor:
        """TRL's loss mask (B, T) bool of ``batch``: ``completion_mask``, and ``tool_mask``
        where TRL has one."""
        mask: torch.Tensor = batch["completion_mask"].bool()
        if "tool_mask" in batch:
            mask = mask & batch["tool_mask"].bool()
        return mask

    def token_advantages(
        self,
        batch: dict[str, Any],
        signals: CreditSignals,
        groups: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Token advantages (B, T) float32 of ``batch`` (``advantages`` (B,),
        ``completion_ids``/``completion_mask`` (B, T), optional ``tool_mask``) and the
        strategy's ``signals`` by ``TrlCredit.apply``: 0 where TRL's loss mask is 0.
        ``groups``: (rewards (B,), groups (B,) int64) at generation time (``step_groups``),
        for a strategy that reads them.

        Rows without a valid token (truncated completions TRL masks out) get 0. A batch-wide
        selection takes its quantile over this batch of every process. Logs the diagnostics
        into TRL's metrics; records the credit samples when due (the compared strategies on
        the same batch, signals and processes).
        """
        mask = self.loss_mask(batch)
        result = self.credit.apply(batch, mask, signals, groups=groups)
        token_adv = result.token_advantages
        mode = "train" if self.policy.training else "eval"
        self.credit.log_diagnostics(self._metrics[mode], result.diagnostics)
        step = self.state.global_step + 1
        if (
            self.samples is not None
            and self.policy.training
            and REWARDS_KEY in batch
            and self.samples.due(step, self.state.max_steps)
        ):
            credits = {self.samples.own: token_adv}
            for label, run in self.credit.compare:
                theirs = compared_signals(run.plan, signals)
                compared = self.credit.apply(batch, mask, theirs, run, groups=groups)
                credits[label] = compared.token_advantages
            shuffled = self.credit_phase == "loss"  # TRL shuffled the rows: one group
            group = mask.shape[0] if shuffled else int(self.num_generations or 1)
            self.samples.record(step, batch, credits, mask, group, self._agreement)
        return token_adv
