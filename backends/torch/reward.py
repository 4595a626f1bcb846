"""Rewards for rollouts, micro-batched: ``adapters.text_reward.RewardSignals`` per chunk.

The scorer sets the advantage; the direction model (a frozen differentiable RM) supplies
the reward gradient, and only when the credit strategy asks for it. Without a separate
scorer the direction model's own reward is used (one RM pass for both).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from adapters.config import build_reward_signals
from adapters.policy import lm_head_of
from adapters.reward import DirectionModel
from adapters.text_reward import ModelScorer, RewardSignals
from backends.torch.config import ConfigError, TrainConfig
from backends.torch.data import Prompt, load_jsonl
from backends.torch.rollout import RolloutBatch
from backends.torch.tasks import get_task


class RewardPipeline:
    """Rewards (B,) and, on request, the reward gradient (B, R, d) of a rollout batch."""

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

    def score(
        self,
        batch: RolloutBatch,
        *,
        with_grad: bool,
        micro_batch_size: int,
        labels: Sequence[Any] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, float]]:
        """Rewards (B,) float32, the gradient (B, R, d) if ``with_grad`` (else None), and the
        adapters' diagnostics averaged over micro-batches. Zero gradient at padding.
        ``labels`` (B,): each row's label, for text scorers that take labels."""
        rewards, grads = [], []
        diagnostics: dict[str, float] = {}
        for start in range(0, batch.size, micro_batch_size):
            rows = slice(start, min(batch.size, start + micro_batch_size))
            mb = batch.select(rows)
            out = self.signals.compute(
                mb.prompt_ids,
                mb.prompt_mask,
                mb.response_ids,
                mb.response_mask,
                need_grad=with_grad,
                labels=None if labels is None else labels[rows],
            )
            rewards.append(out.rewards.float())
            for key, value in out.diagnostics.items():
                diagnostics[key] = diagnostics.get(key, 0.0) + float(value)
            if with_grad:
                grad: Any = out.reward_grad
                pad = batch.response_len - grad.shape[1]
                grads.append(torch.nn.functional.pad(grad.float(), (0, 0, 0, pad)))
        calls = len(rewards)
        mean_diag = {k: v / calls for k, v in diagnostics.items()}
        return torch.cat(rewards), (torch.cat(grads) if with_grad else None), mean_diag


def build_prompts_and_reward(
    cfg: TrainConfig,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    *,
    device: torch.device,
) -> tuple[list[Prompt], list[Prompt], RewardPipeline]:
    """Training prompts, held-out prompts and the reward of ``cfg`` for this policy.

    ``reward`` (``adapters.config.RewardSignalsConfig``) takes precedence; a built-in
    ``data.task`` supplies its own reward otherwise.
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
    if data.num_eval_prompts is not None:
        held_out = held_out[: data.num_eval_prompts]
    return train, held_out, RewardPipeline(signals)
