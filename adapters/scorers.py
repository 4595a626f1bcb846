"""The reward that sets the advantage, kept apart from the model that supplies the direction.

- ``TextScorer``: a plain Python callable ``(prompts, responses) -> rewards`` on decoded text
  (a rule, a verifier); not differentiable. One with a ``labels`` parameter is also given
  each row's label (the ``label`` of its prompt in the data, or None).
- ``Scorer``: what a backend calls to get (B,) rewards for a rollout batch.
  ``CallableScorer`` wraps a ``TextScorer`` (decoding with the policy tokenizer, special
  tokens skipped); ``ModelScorer`` uses a ``DirectionModel``'s own reward.
- ``RewardSignals``: a scorer plus an optional direction model; ``compute`` returns the
  rewards and, when asked, the direction model's gradient, attention and prefix rewards,
  running the RM once when the scorer *is* the direction model.
- ``import_object("pkg.module:name")``: how configs name callables.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from adapters.direction import (
    DirectionModel,
    RewardOutput,
    check_rollout,
    masked_rows,
    score_rollout,
)
from adapters.signature import accepts_keyword
from credit_core import CreditError

TextScorer = Callable[..., "Sequence[float] | torch.Tensor"]


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

    ``labels`` (B,) are the rows' labels, for scorers that use them.
    """

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


class CallableScorer(Scorer):
    """A ``TextScorer`` on the decoded prompt and response texts (and the rows' labels, when
    ``fn`` takes ``labels``: then a call without labels is an error, not a silent None)."""

    def __init__(self, fn: TextScorer, policy_tokenizer: Any, *, name: str = "scorer") -> None:
        if not callable(fn):
            raise CreditError(f"{name}: expected a callable, got {type(fn).__name__}")
        self.fn = fn
        self.takes_labels = accepts_keyword(fn, "labels", via_var_keyword=True)
        self.policy_tokenizer = policy_tokenizer
        self.name = name

    def __call__(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        response_ids: torch.Tensor,
        response_mask: torch.Tensor,
        *,
        labels: Sequence[Any] | None = None,
    ) -> torch.Tensor:
        check_rollout(prompt_ids, prompt_mask, response_ids, response_mask)
        B = response_ids.shape[0]
        prompt_texts = decode_rows(self.policy_tokenizer, prompt_ids, prompt_mask)
        response_texts = decode_rows(self.policy_tokenizer, response_ids, response_mask)
        if self.takes_labels:
            if labels is None or len(labels) != B:
                got = "none" if labels is None else f"{len(labels)}"
                raise CreditError(
                    f"{self.name}: takes labels, expected {B} (one per response), got {got}"
                )
            raw = self.fn(prompt_texts, response_texts, labels=list(labels))
        else:
            raw = self.fn(prompt_texts, response_texts)
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
        return rewards.to(response_ids.device)


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
        """Rewards (B,) float32 from the scorer (given the rows' ``labels``); from the
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
        if not same:
            rewards = self.scorer(
                prompt_ids, prompt_mask, response_ids, response_mask, labels=labels
            )
        if dm is None or not (same or with_grad or with_attention or with_prefix_rewards):
            assert rewards is not None  # the scorer is not a direction model's
            return RewardOutput(rewards, None, {})
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
            out, rewards=rewards, diagnostics=diagnostics, direction_scores=out.rewards.float()
        )
