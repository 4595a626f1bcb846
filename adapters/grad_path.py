"""A curvature-robust reward gradient: g averaged along the path to the expected embedding.

docs/design.md, "Curvature-robust direction". DATC takes g_t = dR/dx_t at the sampled
embeddings x_t = E[y_t]. ``path_reward_grad`` takes it instead at the points

    x_t(a) = E[y_t] + a (m1_t - E[y_t]),   m1_t = p_t^T E (the policy's expected embedding),

for every response token at once, and averages over a in ``path_alphas(n)``: one
point a = 1/2 is the midpoint gradient; n points (k + 1/2)/n the midpoint rule of the
integrated gradient int_0^1 g(x(a)) da, whose dot product with m1 - E[y] is the exact change
of R along that (joint) path as n grows. Each point costs one RM forward and backward.

``PathGradientDirection`` wraps a fast-path ``EmbeddingDirectionModel`` (the RM reads the
policy's token ids) so that ``score(..., with_grad=True)`` returns that gradient as
``reward_grad``: every strategy that reads ``reward_grad`` (``datc`` included) then uses
it, with no change to the strategy contract. m1 comes from an ``ExpectedEmbeddings``
callable: ``HandedExpectedEmbeddings`` serves the m1 (``PolicyStats.m1``) that a backend's
policy pass already computed at the sampling parameters, so the path costs no policy forward.
A backend builds the wrapper (``with_grad_path``) for a strategy whose
``reward_grad_points`` is n >= 1 (``datc_mid``, ``datc_ig``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

import torch

from adapters.direction import DirectionModel, EmbeddingDirectionModel, RewardOutput
from adapters.scorers import ModelScorer, RewardSignals
from credit_core import CreditError


def path_problem(model: DirectionModel | None) -> str | None:
    """Why ``model`` cannot give the path gradient (``reward_grad_points`` >= 1), or None.

    The path x(a) = E[y] + a (m1 - E[y]) moves the RM's input embeddings at the policy's
    response positions: the model must read input embeddings (an
    ``EmbeddingDirectionModel``) of the policy's own token ids (no vocabulary bridge)."""
    if not isinstance(model, EmbeddingDirectionModel):
        return (
            "the direction model must read input embeddings (an EmbeddingDirectionModel), "
            f"got {type(model).__name__}"
        )
    if not model.identical_vocab:
        return (
            "the direction model reads another tokenizer (vocabulary bridge); the path to the "
            "expected embedding needs it to read the policy's token ids"
        )
    return None


def path_model(model: DirectionModel | None) -> EmbeddingDirectionModel:
    """``model``, checked to give the path gradient; ``CreditError`` saying why it cannot
    (``path_problem``)."""
    problem = path_problem(model)
    if problem is not None:
        raise CreditError(f"the path gradient (datc_mid, datc_ig): {problem}")
    assert isinstance(model, EmbeddingDirectionModel)  # path_problem checked it
    return model


def path_alphas(points: int) -> list[float]:
    """The path positions a_k = (k + 1/2) / n, k = 0 .. n - 1 (equal weights) of ``points``
    = n >= 1 points: 1 is the midpoint gradient, n > 1 the integrated gradient."""
    if isinstance(points, bool) or not isinstance(points, int) or points < 1:
        raise CreditError(f"points: expected an int >= 1, got {points!r}")
    return [(k + 0.5) / points for k in range(points)]


class ExpectedEmbeddings(Protocol):
    """m1 (B, R, d) = p_t^T E at every response position of a rollout batch."""

    def __call__(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        response_ids: torch.Tensor,
        response_mask: torch.Tensor,
    ) -> torch.Tensor: ...


def path_reward_grad(
    model: EmbeddingDirectionModel,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    response_ids: torch.Tensor,
    response_mask: torch.Tensor,
    m1: torch.Tensor,
    alphas: list[float],
) -> torch.Tensor:
    """mean_a dR/dx evaluated at x(a) (see module doc), at policy response positions.

    m1 (B, R, d): the expected embeddings of the response positions. Returns (B, R, d) in
    the table's accumulation dtype (float32; float64 for a float64 table), 0 at padding.
    The path and the sum of the gradients are kept in that dtype; each point x(a) is fed
    to the RM in the table's own dtype (a bf16/fp16 RM gets a half-precision leaf, as its
    matmuls require). Only the response tokens move along the path; prompt and special
    tokens stay at their embeddings. Raises ``CreditError`` for a
    bridged RM (another tokenizer: its positions are not the policy's).
    """
    if not alphas:
        raise CreditError("alphas: expected at least one path position")
    prepared = model.prepare(prompt_ids, prompt_mask, response_ids, response_mask)
    index = prepared.policy_index
    if index is None:
        raise CreditError(
            "the path gradient (datc_mid, datc_ig): the reward model reads another tokenizer "
            "(vocabulary bridge); the path to the expected embedding needs the RM to read the "
            "policy's token ids"
        )
    inputs = prepared.inputs
    acc = torch.promote_types(model.table.dtype, torch.float32)
    base = model.table[inputs.input_ids].to(acc)
    B, R = index.shape
    if tuple(m1.shape) != (B, R, base.shape[2]):
        raise CreditError(
            f"m1: expected shape {(B, R, base.shape[2])} (batch, response, RM width), "
            f"got {tuple(m1.shape)}"
        )
    rows, cols = torch.nonzero(index >= 0, as_tuple=True)
    where = index[rows, cols]
    step = torch.zeros_like(base)
    step[rows, where] = m1.to(base.device, acc)[rows, cols] - base[rows, where]
    total = torch.zeros_like(base)
    for a in alphas:
        x = (base + a * step).to(model.table.dtype).detach().requires_grad_(True)
        with torch.enable_grad():
            rewards = model.reward_from_embeds(x, inputs)
            (g,) = torch.autograd.grad(rewards.sum(), x, allow_unused=True)
        if g is not None:
            total += g.to(acc)
    out = torch.zeros(B, R, base.shape[2], dtype=acc, device=base.device)
    out[rows, cols] = total[rows, where] / len(alphas)
    return out.to(response_ids.device)


class HandedExpectedEmbeddings:
    """m1 handed over by a caller that already has it (the old-policy pass computes
    ``PolicyStats`` at the rollout temperature before the rewards are scored), one part per
    micro-batch, served in the order the rewards are then scored. Each part is
    (response_ids (b, r), m1 (b, r, d)); a call for other response ids, or with none left,
    is a ``CreditError`` (never a silent mismatch)."""

    def __init__(self) -> None:
        self._parts: list[tuple[torch.Tensor, torch.Tensor]] = []

    def hand(self, parts: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Replace what is held by ``parts`` (one per micro-batch, in scoring order)."""
        self._parts = list(parts)

    def __call__(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        response_ids: torch.Tensor,
        response_mask: torch.Tensor,
    ) -> torch.Tensor:
        if not self._parts:
            raise CreditError(
                "expected embeddings: none handed for this batch (the old-policy pass hands "
                "m1 to the path gradient before the rewards are scored)"
            )
        ids, m1 = self._parts.pop(0)
        if ids.shape != response_ids.shape or not torch.equal(ids, response_ids.to(ids.device)):
            raise CreditError(
                f"expected embeddings: handed for responses of shape {tuple(ids.shape)}, asked "
                f"for other responses of shape {tuple(response_ids.shape)}"
            )
        return m1


class PathGradientDirection(DirectionModel):
    """``inner`` with its reward gradient taken along the path (``path_reward_grad``);
    ``CreditError`` when ``inner`` cannot take it (``path_problem``).

    Rewards are ``inner``'s at the sampled tokens (one RM forward); with ``with_grad`` the
    gradient costs ``points`` RM forward + backward passes and one ``expected`` call.
    ``reward_embedding`` is ``inner``'s. Attention and prefix rewards are ``inner``'s,
    passed through unchanged: the attention comes from that rewards forward, the prefix
    rewards at ``inner``'s cost; ``gives_attention`` is ``inner``'s.
    """

    def __init__(
        self, inner: DirectionModel | None, expected: ExpectedEmbeddings, points: int
    ) -> None:
        self.inner = path_model(inner)
        self.expected = expected
        self.alphas = path_alphas(points)
        self.reward_embedding = self.inner.reward_embedding

    @property
    def gives_attention(self) -> bool:
        return self.inner.gives_attention

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
        out = self.inner.score(
            prompt_ids,
            prompt_mask,
            response_ids,
            response_mask,
            with_grad=False,
            with_attention=with_attention,
            with_prefix_rewards=with_prefix_rewards,
        )
        if not with_grad:
            return out
        m1 = self.expected(prompt_ids, prompt_mask, response_ids, response_mask)
        grad = path_reward_grad(
            self.inner,
            prompt_ids,
            prompt_mask,
            response_ids,
            response_mask,
            m1,
            self.alphas,
        )
        return replace(out, reward_grad=grad.to(out.rewards.dtype))  # 0 at padding


def with_grad_path(
    signals: RewardSignals, points: int, expected: ExpectedEmbeddings
) -> RewardSignals:
    """``signals`` with its direction model wrapped by ``PathGradientDirection`` (m1 from
    ``expected``); a scorer that was the direction model's own reward becomes the
    wrapper's, so rewards and gradient still share one call."""
    dm = signals.direction_model
    wrapped = PathGradientDirection(dm, expected, points)
    scorer = signals.scorer
    if isinstance(scorer, ModelScorer) and scorer.model is dm:
        scorer = ModelScorer(wrapped)
    return RewardSignals(scorer=scorer, direction_model=wrapped)


def without_grad_path(signals: RewardSignals) -> RewardSignals:
    """``signals`` as they were before ``with_grad_path`` (unchanged if not wrapped)."""
    dm = signals.direction_model
    if not isinstance(dm, PathGradientDirection):
        return signals
    scorer = signals.scorer
    if isinstance(scorer, ModelScorer) and scorer.model is dm:
        scorer = ModelScorer(dm.inner)
    return RewardSignals(scorer=scorer, direction_model=dm.inner)
