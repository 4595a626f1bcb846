"""The reward that sets the advantage, kept apart from the model that supplies the direction.

- ``TextScorer``: a plain Python callable ``(prompts, responses) -> rewards`` on decoded text
  (a rule, a verifier); not differentiable. One with a ``labels`` parameter is also given
  each row's label (the ``label`` of its prompt in the data, or None), one with a
  ``response_ids`` parameter each response's token ids. Per response it returns a number,
  or token rewards: a list per token, ``(start, end, reward)`` step spans over the response's
  token positions, or a mapping with both (``credit_core.parse_reward_outputs``).
- ``Scorer``: what a backend calls to get (B,) rewards for a rollout batch.
  ``CallableScorer`` wraps a ``TextScorer`` (decoding with the policy tokenizer, special
  tokens skipped); ``ModelScorer`` uses a ``DirectionModel``'s own reward; ``PRMScorer``
  uses a ``DirectionModel`` as a process reward model, its score of each response prefix
  that ends a reasoning step given as that step's reward (token rewards, per step).
- ``RewardSignals``: a scorer plus an optional direction model; ``compute`` returns the
  rewards and, when asked, the direction model's gradient, attention and prefix rewards,
  running the RM once when the scorer *is* the direction model.
- ``import_object("pkg.module:name")``: how configs name callables.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch

from adapters.direction import (
    DirectionModel,
    RewardOutput,
    check_rollout,
    masked_rows,
    score_rollout,
)
from adapters.signature import accepts_keyword
from credit_core import CreditError, TokenRewards, parse_reward_outputs
from credit_core.given_rewards import Span

TextScorer = Callable[..., "Sequence[object] | torch.Tensor"]


def import_object(path: str) -> Any:
    """The object named ``"pkg.module:attr"`` (``attr`` may be dotted)."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise CreditError(f"import path: expected 'pkg.module:name', got {path!r}")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise CreditError(f"import path {path!r}: cannot import {module_name!r}: {exc}") from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise CreditError(f"import path {path!r}: {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def decode_rows(tokenizer: Any, ids: torch.Tensor, mask: torch.Tensor) -> list[str]:
    """Decoded text of each row's masked-in tokens, special tokens skipped."""
    return list(tokenizer.batch_decode(masked_rows(ids, mask != 0), skip_special_tokens=True))


class Scorer(ABC):
    """Rewards (B,) float32 for a rollout batch (policy ids, layout as ``DirectionModel``).

    ``labels`` (B,) are the rows' labels, for scorers that use them. ``score`` also gives the
    token rewards of a scorer that has them (None by default); ``gives_token_rewards`` says
    whether a scorer can give any (known before scoring: a backend refuses a strategy that
    reads token rewards at start-up without one).
    """

    gives_token_rewards: ClassVar[bool] = False

    @abstractmethod
    def __call__(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        response_ids: torch.Tensor,
        response_mask: torch.Tensor,
        *,
        labels: Sequence[Any] | None = None,
    ) -> torch.Tensor: ...

    def score(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        response_ids: torch.Tensor,
        response_mask: torch.Tensor,
        *,
        labels: Sequence[Any] | None = None,
    ) -> tuple[torch.Tensor, TokenRewards | None]:
        """The rewards (B,) and the token rewards (``TokenRewards`` (B, R) on the response
        ids' device, or None): here the rewards alone."""
        rewards = self(prompt_ids, prompt_mask, response_ids, response_mask, labels=labels)
        return rewards, None


class ScoreFirst(Scorer):
    """A scorer whose ``score`` is what it computes (rewards and, where it has them, token
    rewards); its rewards (B,) are ``score``'s first part."""

    def __call__(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        response_ids: torch.Tensor,
        response_mask: torch.Tensor,
        *,
        labels: Sequence[Any] | None = None,
    ) -> torch.Tensor:
        return self.score(prompt_ids, prompt_mask, response_ids, response_mask, labels=labels)[0]

    @abstractmethod
    def score(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        response_ids: torch.Tensor,
        response_mask: torch.Tensor,
        *,
        labels: Sequence[Any] | None = None,
    ) -> tuple[torch.Tensor, TokenRewards | None]: ...


class CallableScorer(ScoreFirst):
    """A ``TextScorer`` on the decoded prompt and response texts (and the rows' labels, when
    ``fn`` takes ``labels``: then a call without labels is an error, not a silent None; and
    each response's token ids, a list of ints over its valid tokens, when ``fn`` has a
    ``response_ids`` parameter: the positions its token rewards and step spans index)."""

    gives_token_rewards = True

    def __init__(self, fn: TextScorer, policy_tokenizer: Any, *, name: str = "scorer") -> None:
        if not callable(fn):
            raise CreditError(f"{name}: expected a callable, got {type(fn).__name__}")
        self.fn = fn
        self.takes_labels = accepts_keyword(fn, "labels", via_var_keyword=True)
        self.takes_response_ids = accepts_keyword(fn, "response_ids")
        self.policy_tokenizer = policy_tokenizer
        self.name = name

    def score(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        response_ids: torch.Tensor,
        response_mask: torch.Tensor,
        *,
        labels: Sequence[Any] | None = None,
    ) -> tuple[torch.Tensor, TokenRewards | None]:
        """Rewards (B,) float32 and, where the function returned token rewards for some
        response (a list per token, step spans, or a mapping: ``parse_reward_outputs``), the
        ``TokenRewards`` (B, R) over ``response_mask`` with each response's outcome (given,
        or the sum of its token rewards) as its reward; None where it returned numbers
        (the rewards then exactly as before). ``CreditError`` naming the function and the
        response for a bad item."""
        check_rollout(prompt_ids, prompt_mask, response_ids, response_mask)
        B = response_ids.shape[0]
        prompt_texts = decode_rows(self.policy_tokenizer, prompt_ids, prompt_mask)
        response_texts = decode_rows(self.policy_tokenizer, response_ids, response_mask)
        kwargs: dict[str, Any] = {}
        if self.takes_response_ids:
            kwargs["response_ids"] = masked_rows(response_ids, response_mask != 0)
        if self.takes_labels:
            if labels is None or len(labels) != B:
                got = "none" if labels is None else f"{len(labels)}"
                raise CreditError(
                    f"{self.name}: takes labels, expected {B} (one per response), got {got}"
                )
            kwargs["labels"] = list(labels)
        raw = self.fn(prompt_texts, response_texts, **kwargs)
        if isinstance(raw, list | tuple) and _per_token(raw):
            rewards, token_rewards = parse_reward_outputs(raw, response_mask.bool(), name=self.name)
            return rewards, token_rewards
        try:
            rewards = torch.as_tensor(raw, dtype=torch.float32).detach().cpu()
        except (TypeError, ValueError) as exc:
            raise CreditError(
                f"{self.name}: expected a sequence of {B} numbers, got {type(raw).__name__}"
            ) from exc
        if tuple(rewards.shape) != (B,):
            raise CreditError(
                f"{self.name}: expected {B} rewards (one per response), got shape "
                f"{tuple(rewards.shape)}"
            )
        bad = ~torch.isfinite(rewards)
        if bool(bad.any()):
            raise CreditError(
                f"{self.name}: non-finite rewards in rows {torch.nonzero(bad).flatten().tolist()}"
            )
        return rewards.to(response_ids.device), None


def _per_token(raw: Sequence[object]) -> bool:
    """Whether a function's output holds token rewards: an item that is a list, tuple,
    mapping or 1-D tensor (not a number)."""
    return any(
        isinstance(item, list | tuple | Mapping)
        or (isinstance(item, torch.Tensor) and item.dim() > 0)
        for item in raw
    )


class ModelScorer(Scorer):
    """The reward of a ``DirectionModel`` (no gradient), float32."""

    def __init__(self, model: DirectionModel) -> None:
        self.model = model

    def __call__(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        response_ids: torch.Tensor,
        response_mask: torch.Tensor,
        *,
        labels: Sequence[Any] | None = None,
    ) -> torch.Tensor:
        out = self.model.score(
            prompt_ids, prompt_mask, response_ids, response_mask, with_grad=False
        )
        return out.rewards.float()


class PRMScorer(ScoreFirst):
    """A process reward model (PRM) as step scorer: Lightman et al. 2023 ("Let's Verify
    Step by Step", arXiv 2305.20050), Math-Shepherd (Wang et al. 2024, arXiv 2312.08935).

    A response's steps end at each valid response token whose text, decoded alone by the
    policy tokenizer (special tokens decode to nothing), contains ``step_separator``, and at
    its last valid token. Step j's reward is ``model``'s score of the prompt with the
    response's prefix through step j's last token, given at that token (a span over the
    step's tokens, ``TokenRewards.from_spans``). The response's reward R is its last step's
    score: the model's score of the whole response (the PRM literature aggregates step
    scores by their product, Lightman et al., their min, Math-Shepherd, or the last; this is
    the last). An empty response has no step and R = the model's score of the prompt alone.

    Cost: one no-grad ``model.score`` pass per chunk of at most B prefix rows (B the rows of
    the batch passed in: the caller's micro-batch), rows of similar length together; a batch
    whose responses hold S steps in all takes ceil(S / B) passes, about the mean number of
    steps per response. Where the model's forward is a collective (``agree_count``, ZeRO-3)
    the processes would run different numbers of passes: not supported.
    """

    gives_token_rewards = True

    def __init__(self, model: DirectionModel, policy_tokenizer: Any, step_separator: str) -> None:
        if not isinstance(step_separator, str) or not step_separator:
            raise CreditError(
                f"step_separator: expected a non-empty string, got {step_separator!r}"
            )
        self.model = model
        self.policy_tokenizer = policy_tokenizer
        self.step_separator = step_separator
        self._ends_step: dict[int, bool] = {}  # token id -> its text holds the separator

    def step_ends(self, response_ids: torch.Tensor, response_mask: torch.Tensor) -> list[list[int]]:
        """Per row of ``response_ids`` (B, R) under the right-padded ``response_mask`` (B,
        R), the response-token positions (0 .. n_b - 1) where its steps end, increasing:
        each token whose decoded text holds the separator, and n_b - 1 (none for n_b = 0)."""
        rows = masked_rows(response_ids, response_mask != 0)
        unseen = sorted({t for ids in rows for t in ids} - self._ends_step.keys())
        for token in unseen:
            text = self.policy_tokenizer.decode([token], skip_special_tokens=True)
            self._ends_step[token] = self.step_separator in text
        return [
            [k for k, t in enumerate(ids[:-1]) if self._ends_step[t]] + [len(ids) - 1]
            if ids
            else []
            for ids in rows
        ]

    def score(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        response_ids: torch.Tensor,
        response_mask: torch.Tensor,
        *,
        labels: Sequence[Any] | None = None,
    ) -> tuple[torch.Tensor, TokenRewards | None]:
        """Rewards (B,) float32 (each response's last step score) and the ``TokenRewards``
        (B, R) over ``response_mask``: step j's score at its last token (class docstring),
        on the response ids' device."""
        _, rmask = check_rollout(prompt_ids, prompt_mask, response_ids, response_mask)
        ends = self.step_ends(response_ids, rmask)
        cuts = [(b, end + 1) for b, row in enumerate(ends) for end in row]
        cuts += [(b, 0) for b, row in enumerate(ends) if not row]
        scores = self.prefix_scores(prompt_ids, prompt_mask, response_ids, response_mask, cuts)
        spans: list[list[Span]] = [[] for _ in ends]
        rewards = [0.0] * len(ends)
        for (b, cut), s in zip(cuts, scores, strict=True):
            start = spans[b][-1][1] if spans[b] else 0
            if cut > 0:
                spans[b].append((start, cut, s))
            rewards[b] = s  # the cuts of a row increase: its last one is the whole response
        token_rewards = TokenRewards.from_spans(spans, rmask)
        return torch.tensor(rewards, dtype=torch.float32, device=response_ids.device), token_rewards

    def prefix_scores(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        response_ids: torch.Tensor,
        response_mask: torch.Tensor,
        cuts: Sequence[tuple[int, int]],
    ) -> list[float]:
        """The model's score of row b's prompt with its first t response tokens, for each
        ``(b, t)`` of ``cuts`` (0 <= t <= the row's valid length), in the order given: no-grad
        ``model.score`` passes of at most B rows each, cuts sorted by t (class docstring)."""
        B = response_ids.shape[0]
        order = sorted(range(len(cuts)), key=lambda k: cuts[k][1])
        out = [0.0] * len(cuts)
        device = response_ids.device
        for first in range(0, len(order), max(B, 1)):
            chunk = order[first : first + B]
            rows = torch.tensor([cuts[k][0] for k in chunk], dtype=torch.long, device=device)
            t = torch.tensor([cuts[k][1] for k in chunk], dtype=torch.long, device=device)
            width = max(int(t.max()), min(1, response_ids.shape[1]))
            ids = response_ids[rows, :width]
            mask = (torch.arange(width, device=device) < t.unsqueeze(1)).to(response_mask.dtype)
            scored = self.model.score(
                prompt_ids[rows], prompt_mask[rows], ids, mask, with_grad=False
            ).rewards
            for k, value in zip(chunk, scored.double().tolist(), strict=True):
                out[k] = value
        return out


@dataclass(frozen=True)
class RewardSignals:
    """The reward (``scorer``) and, optionally, the direction (``direction_model``)."""

    scorer: Scorer
    direction_model: DirectionModel | None = None

    @property
    def direction_is_reward(self) -> bool:
        """Whether the scorer is the direction model's own reward (one model for both)."""
        scorer = self.scorer
        return isinstance(scorer, ModelScorer) and scorer.model is self.direction_model

    def compute(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        response_ids: torch.Tensor,
        response_mask: torch.Tensor,
        *,
        with_grad: bool,
        labels: Sequence[Any] | None = None,
        with_attention: bool = False,
        with_prefix_rewards: bool = False,
    ) -> RewardOutput:
        """Rewards (B,) float32 and its token rewards, if any, from the scorer (given the
        rows' ``labels``; ``Scorer.score``); from the
        direction model, when asked: ``reward_grad`` (``with_grad``), ``attention``
        (``with_attention``) and ``prefix_rewards`` (``with_prefix_rewards``), see
        ``RewardOutput``. One RM forward (+ backward) gives the gradient and the attention,
        shared with the scorer's RM pass when the scorer is the direction model itself.

        With a separate scorer the attention and prefix rewards are still the direction
        model's (as its gradient is): its prefix rewards then sum to the direction model's
        reward minus s_0, not to the scorer's reward; its own reward is then
        ``direction_scores`` (a by-product of the same pass, for its agreement with the
        scorer's reward).
        """
        dm = self.direction_model
        for wanted, signal in (
            (with_grad, "reward_grad"),
            (with_attention, "attention"),
            (with_prefix_rewards, "prefix_rewards"),
        ):
            if wanted and dm is None:
                raise CreditError(
                    f"{signal} was asked for, but no direction model is configured "
                    "(set a differentiable reward model as the direction model)"
                )
        same = self.direction_is_reward
        rewards: torch.Tensor | None = None
        token_rewards: TokenRewards | None = None
        if not same:
            rewards, token_rewards = self.scorer.score(
                prompt_ids, prompt_mask, response_ids, response_mask, labels=labels
            )
        if dm is None or not (same or with_grad or with_attention or with_prefix_rewards):
            assert rewards is not None  # the scorer is not a direction model's
            return RewardOutput(rewards, None, {}, token_rewards=token_rewards)
        out = score_rollout(
            dm,
            prompt_ids,
            prompt_mask,
            response_ids,
            response_mask,
            with_grad=with_grad,
            with_attention=with_attention,
            with_prefix_rewards=with_prefix_rewards,
        )
        if rewards is None:
            return replace(out, rewards=out.rewards.float())
        diagnostics = {
            **out.diagnostics,
            "rm/direction_model_reward_mean": float(out.rewards.mean()),
        }
        return replace(
            out,
            rewards=rewards,
            diagnostics=diagnostics,
            direction_scores=out.rewards.float(),
            token_rewards=token_rewards,
        )
