"""The native trainer's credit path, one process: from a rollout batch to its token advantages.

``CreditPath`` is built once per process from the run's ``CreditPlan`` (``credit_plan``: the
strategy, built once, and the signals it reads) and the components the credit reads (the
reward side, the reference policy, the implicit PRM, the critic, the answer span), checking
at build that they serve the strategy. ``signals`` is the recipe's second phase: rewards,
``group_advantages`` (groups never straddle ranks), the old-policy pass with only the signals
the strategy reads (the RM gradient, policy stats or W0, the entropy), the RM's attention,
prefix rewards or attribution from its scoring, the token rewards a reward function
returned, OAR-G's answer saliency, the reference and implicit-PRM log-probs, then the
run's one ``CreditRun.apply`` (``assign_credit``, the
direction model's agreement with the reward, the gate's mix) and, under
``algorithm.estimator: gae``, PPO's credit from the strategy's result (docs/design.md, "PPO
with a critic (GAE)", "Credit under a critic").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
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
from backends.common.data import Prompt
from backends.common.errors import ConfigError
from backends.torch.answer_span import AnswerSpan
from backends.torch.config import BACKEND, TrainConfig
from backends.torch.critic import response_values
from backends.torch.distributed import DistContext, root_gathered, unwrap
from backends.torch.gae import gae_advantages_and_returns, outcome_token_rewards, whiten
from backends.torch.implicit_prm import ImplicitPRM
from backends.torch.kl import kl_estimate
from backends.torch.rollout import RolloutBatch, derive_seed, pad_responses
from backends.torch.rollout_rewards import RolloutRewards
from backends.torch.step import PhaseClock, StepSignals
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


def prompt_labels(batch: RolloutBatch, pool: Sequence[Prompt]) -> list[Any]:
    """The label of each row's prompt (``batch.group`` indexes ``pool``)."""
    return [pool[g].label for g in batch.group.tolist()]


class CreditPath:
    """The credit of one native-trainer process: ``plan`` (its one strategy), ``run`` (the
    ``CreditRun`` with the gate, if any) and what the strategy's signals are read from.

    ``ConfigError`` at build, naming the key, where the components do not serve the
    strategy: no differentiable direction model for a strategy that needs one, one that
    does not give what it reads, a null row the direction model lacks, OAR-G's input
    gradient under FSDP, or token rewards read without a reward function to give them.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        ctx: DistContext,
        plan: CreditPlan,
        reward: RolloutRewards,
        *,
        answer_span: AnswerSpan | None,
        ref_model: torch.nn.Module | None,
        prm: ImplicitPRM | None,
        critic: torch.nn.Module | None,
    ) -> None:
        self.cfg = cfg
        self.ctx = ctx
        self.plan = plan
        self.reward = reward
        self.answer_span = answer_span
        self.ref_model = ref_model
        self.prm = prm
        self.critic = critic
        name = plan.name
        try:
            self.run = CreditRun(
                plan, cfg.credit.gate, direction_is_reward=reward.signals.direction_is_reward
            )
        except CreditError as err:
            raise ConfigError(str(err)) from err
        direction = reward.direction
        if plan.needs_direction and direction is None:
            raise ConfigError(
                f"credit: strategy {name!r} needs a differentiable reward model "
                "(reward.direction_model), but the config has none"
            )
        if direction is not None:
            problem = plan.direction_problem(
                "reward.direction_model",
                type(direction).__name__,
                gives_attention=direction.gives_attention,
                path_problem=None,  # build_prompts_and_reward built it for grad_points
            )
            if problem is not None:
                raise ConfigError(str(problem))
            if "reward_attribution" in plan.signals:
                try:
                    direction.null_embedding(self.strategy.attribution_null)
                except CreditError as err:
                    raise ConfigError(
                        f"credit: strategy {name!r} reads reward_attribution: {err}"
                    ) from err
        if ANSWER_SALIENCY in plan.signals and ctx.active and cfg.distributed.strategy == "fsdp":
            raise ConfigError(
                f"distributed.strategy: 'fsdp'; credit strategy {name!r} takes the policy's "
                "own input gradient (answer_saliency) on its whole, unsharded weights: use "
                "'ddp'"
            )
        if plan.reads_token_rewards and not reward.signals.scorer.gives_token_rewards:
            raise ConfigError(
                f"reward.reward: credit strategy {name!r} reads the token rewards a reward "
                "function or a PRM gives, but the reward is neither: set reward.reward to "
                "{kind: callable, function: 'pkg.module:name'} returning, per response, a list "
                "per token or (start, end, reward) step spans, or to {kind: prm, model: ..., "
                "step_separator: ...} (docs/reward_models.md)"
            )

    @property
    def strategy(self) -> CreditStrategy:
        """The run's one strategy instance."""
        return self.plan.strategy

    @property
    def gae(self) -> bool:
        """PPO with a critic (``algorithm.estimator: gae``)."""
        return self.cfg.algorithm.estimator == "gae"

    def old_policy_pass(
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
        model: torch.nn.Module,
        batch: RolloutBatch,
        pool: Sequence[Prompt],
        *,
        step: int,
        strategy: CreditStrategy | None = None,
        rewards: RolloutRewards | None = None,
        advance: bool = False,
    ) -> StepSignals:
        """The credit path: rewards, advantages, old/ref log-probs, the strategy's signals
        and token advantages of ``batch`` (whose ``group`` indexes ``pool``), sampled by the
        policy ``model`` (wrapped, as trained) at training step ``step``.

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
            old = self.old_policy_pass(model, batch, embedding=side.embedding, stats=True)
            handed = _handed_expected(side)
            if handed is not None:
                handed.hand(old.expected)
        clock = PhaseClock(self.ctx.device)
        reward = side.compute(
            batch,
            with_grad=plan.needs_reward_grad,
            micro_batch_size=cfg.algorithm.micro_batch_size,
            labels=prompt_labels(batch, pool),
            with_attention="reward_attention" in reads,
            with_prefix_rewards="prefix_rewards" in reads,
        )
        reward_seconds = clock.lap()
        token_rewards = side.token_rewards_for(strategy, reward.token_rewards, own=own)
        estimator = "group_norm" if self.gae else cfg.algorithm.estimator
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
            old = self.old_policy_pass(
                model,
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
            saliency = self._answer_saliency_pass(
                model, batch, answer_mask, strategy.answer_noise_std, step
            )
        ref_logp = kl_ref = log_ratio = None
        if self.ref_model is not None:
            ref_logp = self.old_policy_pass(self.ref_model, batch).logp
        if cfg.algorithm.kl_coef > 0:
            assert ref_logp is not None
            kl_ref = kl_estimate(old.logp, ref_logp, cfg.algorithm.kl_estimator)
        if "implicit_log_ratio" in reads:
            if self.prm is None or ref_logp is None:
                raise ConfigError(
                    f"credit: strategy {strategy.name!r} reads the implicit PRM, which the "
                    "trainer builds only when the run's own strategy reads it"
                )
            log_ratio = self.old_policy_pass(self.prm.model, batch).logp - ref_logp
        run = (
            self.run
            if own
            else CreditRun(plan, direction_is_reward=side.signals.direction_is_reward)
        )
        applied = run.apply(
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
                token_rewards=token_rewards,
            ),
            rewards=reward.rewards,
            groups=self.group_ids(batch),
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
            credit=applied.result,
            kl_ref=kl_ref,
            reward_diagnostics=reward.diagnostics,
            reward_grad_rows=batch.size if reward.reward_grad is not None else 0,
            policy_stats_rows=batch.size if old.stats is not None or old.work is not None else 0,
            reward_seconds=reward_seconds,
            agreement=applied.agreement,
        )
        return self._gae_credit(signals) if own and self.gae else signals

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
            self.group_ids(batch),
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
        self,
        model: torch.nn.Module,
        batch: RolloutBatch,
        answer_mask: torch.Tensor,
        noise_std: float,
        step: int,
    ) -> torch.Tensor:
        """OAR-G's s (B, R) of the current policy (``adapters.answer_saliency``), micro-batched:
        per micro-batch one no-grad forward and one forward + backward to the input
        embeddings, the weights frozen; the noise is drawn from a generator seeded by (seed,
        step, rank) on the policy's device."""
        cfg = self.cfg
        dev = self.ctx.device
        generator = torch.Generator(device=dev)
        generator.manual_seed(derive_seed(cfg.seed, ANSWER_SALIENCY, step, self.ctx.rank))
        inner = unwrap(model).module
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

    def group_ids(self, batch: RolloutBatch) -> torch.Tensor:
        """(B,) int64: the group of each row (rows are ordered group by group on a rank)."""
        rows = torch.arange(batch.size, device=batch.response_ids.device)
        return rows // self.cfg.rollout.group_size
