"""A direction model that gives every signal of ``DirectionModel.score``: the reward, its
gradient, an attention over the response and prefix rewards (for ``abc`` and ``red``)."""

from __future__ import annotations

import torch

from adapters.direction import RewardOutput
from tests.helpers.openrlhf import TinyDirectionModel


class SignalDirectionModel(TinyDirectionModel):
    """``TinyDirectionModel`` that also gives, on request, an attention over the response
    (softmax of E[y_t] . w over its valid tokens) and its prefix rewards s_{t+1} - s_t (s_t:
    the mean token score of the first t tokens, s_0 = 0, so they add up to the reward);
    ``requests`` records every call's (with_grad, with_attention, with_prefix_rewards)."""

    def __init__(self, vocab: int, dim: int, seed: int) -> None:
        super().__init__(vocab, dim, seed)
        self.requests: list[tuple[bool, bool, bool]] = []

    @property
    def gives_attention(self) -> bool:
        return True

    def score(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        response_ids: torch.Tensor,
        response_mask: torch.Tensor,
        *,
        with_grad: bool,
        with_attention: bool = False,
        with_prefix_rewards: bool = False,
    ) -> RewardOutput:
        self.requests.append((with_grad, with_attention, with_prefix_rewards))
        out = super().score(
            prompt_ids, prompt_mask, response_ids, response_mask, with_grad=with_grad
        )
        E, valid = self.reward_embedding, response_mask.bool()
        attention = prefix = None
        if with_attention:
            logits = torch.where(valid, E[response_ids] @ self.w, float("-inf"))
            attention = torch.where(valid, torch.softmax(logits, dim=1), 0.0)
        if with_prefix_rewards:
            pm = prompt_mask.float().unsqueeze(2)
            context = (E[prompt_ids] * pm).sum(1) / pm.sum(1).clamp_min(1.0)
            h = torch.tanh((E[response_ids] + context.unsqueeze(1)) @ self.W + self.c) @ self.w
            t = torch.arange(1, h.shape[1] + 1)
            s = torch.cumsum(torch.where(valid, h, 0.0), dim=1) / t
            prefix = torch.where(valid, s - torch.nn.functional.pad(s, (1, 0))[:, :-1], 0.0)
        return RewardOutput(
            rewards=out.rewards,
            reward_grad=out.reward_grad,
            attention=attention,
            prefix_rewards=prefix,
        )


def signal_direction_model(vocab: int, dim: int, seed: int) -> SignalDirectionModel:
    """Factory for ``RewardModelConfig(kind="module", factory="tests.backends.openrlhf
    .signal_direction:signal_direction_model")``."""
    return SignalDirectionModel(vocab, dim, seed)
