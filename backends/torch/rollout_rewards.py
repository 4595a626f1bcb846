"""Rewards for rollouts, micro-batched: ``adapters.scorers.RewardSignals`` per chunk.

The scorer sets the advantage; the direction model (a frozen differentiable RM) supplies
the reward gradient, and only when the credit strategy asks for it. Without a separate
scorer the direction model's own reward is used (one RM pass for both). A ``reward: {kind:
callable}`` function may return token rewards (a list per token or step spans per
response), and a ``reward: {kind: prm}`` model gives its step scores as step spans; they go
to a strategy that reads them (``RolloutRewards.token_rewards_for``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from adapters.config import build_reward_signals
from adapters.direction import DirectionModel, RewardOutput
from adapters.grad_path import HandedExpectedEmbeddings, with_grad_path
from adapters.policy import lm_head_of
from adapters.scorers import CallableScorer, ModelScorer, PRMScorer, RewardSignals
from backends.common.data import Prompt, load_jsonl
from backends.common.errors import ConfigError
from backends.common.tasks import get_task
from backends.torch.config import TrainConfig
from backends.torch.rollout import RolloutBatch, pad_responses
from credit_core import CreditStrategy, TokenRewards


class RolloutRewards:
    """Rewards (B,) and, on request, the reward gradient (B, R, d), the attention (B, R)
    and the prefix rewards (B, R) of a rollout batch."""

    def __init__(self, signals: RewardSignals) -> None:
        self.signals = signals

    @property
    def direction(self) -> DirectionModel | None:
        return self.signals.direction_model

    @property
    def embedding(self) -> torch.Tensor | None:
        """The RM input-embedding table E (V_policy, d), or None without a direction model."""
        dm = self.signals.direction_model
        return None if dm is None else dm.reward_embedding

    def token_rewards_for(
        self, strategy: CreditStrategy, token_rewards: TokenRewards | None, *, own: bool = True
    ) -> TokenRewards | None:
        """The token rewards to pass to ``strategy`` (``CreditSignals.token_rewards``): those
        the reward function returned (``compute``'s ``token_rewards``) where the strategy
        reads them (``reads_token_rewards``), else None. ``ConfigError`` naming ``credit``
        where the strategy reads them and the reward gave one number per response, or, for
        the run's ``own`` strategy, where the function returned token rewards and the
        strategy does not read them (another strategy judged on the batch just goes
        without)."""
        name = strategy.name
        scorer = self.signals.scorer
        if isinstance(scorer, CallableScorer):
            source = f"the reward function {scorer.name!r}"
        elif isinstance(scorer, PRMScorer):
            source = "the process reward model (reward.reward of kind prm)"
        else:
            source = "the reward (not a reward.reward of kind callable or prm)"
        if type(strategy).reads_token_rewards:
            if token_rewards is None:
                raise ConfigError(
                    f"credit: strategy {name!r} reads token rewards, but {source} gave one "
                    "number per response; return a list per token or (start, end, reward) "
                    "step spans per response (docs/reward_models.md)"
                )
            return token_rewards
        if token_rewards is not None and own:
            raise ConfigError(
                f"credit: strategy {name!r} does not read token rewards, but {source} "
                "returned rewards per token or per step; use credit: process (or return one "
                "number per response)"
            )
        return None

    def compute(
        self,
        batch: RolloutBatch,
        *,
        with_grad: bool,
        micro_batch_size: int,
        labels: Sequence[Any] | None = None,
        with_attention: bool = False,
        with_prefix_rewards: bool = False,
    ) -> RewardOutput:
        """Rewards (B,) float32; the gradient (B, R, d) float32 if ``with_grad``, the
        attention (B, R) float32 if ``with_attention`` and the prefix rewards (B, R) float32
        if ``with_prefix_rewards`` (each None when not asked; 0 at padding, R the batch's
        response length; see ``adapters.direction.RewardOutput``); the direction model's own
        scores (B,) where a separate scorer set the rewards and the direction model ran; and
        the adapters' diagnostics averaged over micro-batches; the token rewards (B, R) a
        reward function returned (``token_rewards``, None where it returned numbers).
        ``labels`` (B,): each row's label, for text scorers that take labels."""
        rewards: list[torch.Tensor] = []
        given: list[tuple[int, TokenRewards | None]] = []
        grads: list[torch.Tensor] = []
        attention: list[torch.Tensor] = []
        prefix_rewards: list[torch.Tensor] = []
        scores: list[torch.Tensor] = []
        diagnostics: dict[str, float] = {}
        calls = 0
        for rows, mb in batch.micro_batches(micro_batch_size):
            out = self.signals.compute(
                mb.prompt_ids,
                mb.prompt_mask,
                mb.response_ids,
                mb.response_mask,
                with_grad=with_grad,
                labels=None if labels is None else labels[rows],
                with_attention=with_attention,
                with_prefix_rewards=with_prefix_rewards,
            )
            calls += 1
            rewards.append(out.rewards.float())
            given.append((mb.size, out.token_rewards))
            if out.direction_scores is not None:
                scores.append(out.direction_scores.float())
            for key, value in out.diagnostics.items():
                diagnostics[key] = diagnostics.get(key, 0.0) + float(value)
            for part, parts in (
                (out.reward_grad, grads),
                (out.attention, attention),
                (out.prefix_rewards, prefix_rewards),
            ):
                if part is not None:
                    parts.append(pad_responses(part.float(), batch.response_len))
        return RewardOutput(
            torch.cat(rewards),
            torch.cat(grads) if with_grad else None,
            {k: v / calls for k, v in diagnostics.items()},
            torch.cat(attention) if with_attention else None,
            torch.cat(prefix_rewards) if with_prefix_rewards else None,
            torch.cat(scores) if scores else None,
            _joined(given, batch.response_len),
        )


def _joined(parts: list[tuple[int, TokenRewards | None]], R: int) -> TokenRewards | None:
    """The micro-batches' token rewards ((rows, part) each) as one ``TokenRewards`` (B, R),
    a part without any given nowhere; None where no part has any."""
    if all(part is None for _, part in parts):
        return None
    device = next(part.values.device for _, part in parts if part is not None)
    joined = [
        TokenRewards(
            torch.zeros(n, R, dtype=torch.float64, device=device),
            torch.zeros(n, R, dtype=torch.bool, device=device),
        )
        if part is None
        else part.pad_to(R)
        for n, part in parts
    ]
    return TokenRewards.cat(joined)


def build_prompts_and_reward(
    cfg: TrainConfig,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    *,
    device: torch.device,
    grad_points: int = 0,
) -> tuple[list[Prompt], list[Prompt], RolloutRewards]:
    """Training prompts, held-out prompts and the reward of ``cfg`` for this policy.

    ``reward`` (``adapters.config.RewardSignalsConfig``) takes precedence; a built-in
    ``data.task`` supplies its own reward otherwise. With ``grad_points`` >= 1 (the credit
    strategy's ``reward_grad_points``) the direction model's gradient is averaged over that
    many points of the path to ``model``'s expected embeddings (``adapters.grad_path``), m1
    handed over by the trainer's old-policy pass (``HandedExpectedEmbeddings``).
    """
    data = cfg.data
    vocab = int(lm_head_of(model)[0].shape[0])
    signals: RewardSignals | None = None
    if cfg.reward is not None:
        signals = build_reward_signals(
            cfg.reward, tokenizer, policy_vocab_size=vocab, device=device
        )
    if data.task is not None:
        task = get_task(data.task, data.task_params, vocab)
        train, held_out = task.train_prompts, task.eval_prompts
        if signals is None:
            direction = task.build_direction(device)
            signals = RewardSignals(ModelScorer(direction), direction)
    else:
        assert data.train_file is not None  # the config guarantees one source
        train = load_jsonl(data.train_file)
        held_out = load_jsonl(data.eval_file) if data.eval_file else []
    if signals is None:
        raise ConfigError(
            "reward: set reward.direction_model and/or reward.reward (or use a data.task)"
        )
    if grad_points:
        signals = with_grad_path(signals, grad_points, HandedExpectedEmbeddings())
    if data.num_eval_prompts is not None:
        held_out = held_out[: data.num_eval_prompts]
    return train, held_out, RolloutRewards(signals)
