"""Direction models for the OpenRLHF tests: one that gives every signal of
``DirectionModel.score`` (the reward, its gradient, an attention over the response and prefix
rewards, for ``abc`` and ``red``), and a curved ``ModuleRM`` for the path gradient
(``datc_mid``, ``datc_ig``)."""

from __future__ import annotations

import torch

from adapters.direction import RewardOutput
from adapters.reward_models import ModuleRM
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


class CurvedReward(torch.nn.Module):
    """R = mean over attended positions of tanh(x_t W + c) . w, plus (that mean of x_t . u)^2:
    curved enough that the gradient on the path to m1 differs from the one at the samples;
    ``calls`` counts its forwards (one per point of the path, one per reward)."""

    def __init__(self, dim: int, gen: torch.Generator) -> None:
        super().__init__()
        self.W = torch.nn.Parameter(torch.randn(dim, dim, generator=gen) / dim**0.5)
        self.c = torch.nn.Parameter(torch.randn(dim, generator=gen))
        self.w = torch.nn.Parameter(torch.randn(dim, generator=gen))
        self.u = torch.nn.Parameter(torch.randn(dim, generator=gen) / dim**0.5)
        self.calls = 0

    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        m = attention_mask.to(inputs_embeds.dtype)
        n = m.sum(1).clamp_min(1.0)
        h = torch.tanh(inputs_embeds @ self.W + self.c) @ self.w
        pooled = (inputs_embeds @ self.u * m).sum(1) / n
        return (h * m).sum(1) / n + pooled**2


def path_direction_model(vocab: int, dim: int, seed: int) -> ModuleRM:
    """A ``ModuleRM`` (an ``EmbeddingDirectionModel`` reading the policy's ids, as the path
    gradient needs) around ``CurvedReward``; factory for ``RewardModelConfig(kind="module",
    factory="tests.backends.openrlhf.signal_direction:path_direction_model")``."""
    gen = torch.Generator().manual_seed(seed)
    embedding = torch.randn(vocab, dim, generator=gen)
    return ModuleRM(CurvedReward(dim, gen), embedding, policy_vocab_size=vocab)
