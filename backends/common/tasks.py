"""Built-in tasks: prompts plus a reward, runnable offline on a tiny policy.

- ``positional``: a frozen, differentiable tiny reward model scores the response tokens at a
  few fixed positions (docs/design.md, "Evaluation", the toy check: most tokens do not
  matter). The RM lives in the policy's vocabulary: E (V, d) random,
  f(x) = v . tanh(A x + b) standardized over the vocabulary,
  r = (1/|S|) sum_{t in S, t < n} f(E[y_t]). Prompts are short word sequences; the reward
  does not depend on them, so held-out prompts measure the same skill.
- ``arithmetic`` (``backends.common.arithmetic``): short sums for a pretrained chat model,
  checked exactly on the decoded text; no reward model of its own (the config's ``reward``
  names the scorer and, when needed, a direction model).

``get_task(name, params, vocab_size)`` builds one; ``TASKS`` lists them. A task is reusable
outside the trainer (the ablation runner builds the same task for every strategy).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from adapters.direction import DirectionModel
from adapters.reward_models import ModuleRM
from adapters.tiny import TINY_CORPUS
from backends.common.arithmetic import SCORER, ArithmeticParams, arithmetic_prompts
from backends.common.data import Prompt
from backends.common.errors import ConfigError, FieldError
from credit_core.errors import validation_messages


@dataclass(frozen=True)
class Task:
    """Prompts for training and held-out evaluation, and a reward factory.

    ``build_direction(device)`` returns the frozen differentiable reward model
    (``adapters.direction.DirectionModel``) that both sets the reward and supplies its gradient;
    a task that scores text instead raises ``ConfigError`` there, naming the ``reward`` keys
    to set.
    """

    name: str
    train_prompts: list[Prompt]
    eval_prompts: list[Prompt]
    build_direction: Callable[[torch.device], DirectionModel]


def _word_prompts(n: int, seed: int, exclude: set[str]) -> list[Prompt]:
    words = sorted({w.strip(".,;:!?'\"").lower() for s in TINY_CORPUS for w in s.split()} - {""})
    rng = random.Random(seed)
    out: list[Prompt] = []
    seen = set(exclude)
    while len(out) < n:
        text = " ".join(rng.choice(words) for _ in range(rng.randint(3, 6)))
        if text not in seen:
            seen.add(text)
            out.append(Prompt(text))
    return out


class PositionalParams(BaseModel):
    """Parameters of the ``positional`` task."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_prompts: int = Field(default=64, ge=1)
    num_eval_prompts: int = Field(default=16, ge=1)
    positions: tuple[int, ...] = Field(default=(1, 3, 5), description="scored response positions")
    embed_dim: int = Field(default=16, ge=1)
    seed: int = Field(default=0, description="seed of the prompts and the RM (not the run's seed)")

    @field_validator("positions")
    @classmethod
    def _positions(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value or min(value) < 0 or len(set(value)) != len(value):
            raise ValueError(f"expected distinct response positions >= 0, got {list(value)}")
        return value


class PositionalRM(torch.nn.Module):
    """r = (1/|S|) sum over scored positions t < n of f(x_t), x_t the t-th response embedding.

    The module of an ``adapters.reward_models.ModuleRM`` reading the response alone: column t of
    ``inputs_embeds`` is response token t. ``embedding`` (V, d) is its input table.
    """

    positions: torch.Tensor
    f_mean: torch.Tensor
    f_std: torch.Tensor

    def __init__(self, vocab_size: int, params: PositionalParams) -> None:
        super().__init__()
        d = params.embed_dim
        gen = torch.Generator().manual_seed(params.seed)
        self.embedding = torch.nn.Parameter(torch.randn(vocab_size, d, generator=gen))
        self.A = torch.nn.Parameter(torch.randn(d, d, generator=gen) / math.sqrt(d))
        self.b = torch.nn.Parameter(torch.randn(d, generator=gen))
        self.v = torch.nn.Parameter(torch.randn(d, generator=gen) / math.sqrt(d))
        self.register_buffer("positions", torch.tensor(params.positions, dtype=torch.long))
        with torch.no_grad():
            f = self._raw(self.embedding)
            self.register_buffer("f_mean", f.mean())
            self.register_buffer("f_std", f.std())
        self.requires_grad_(False).eval()

    def _raw(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ self.A.T + self.b) @ self.v

    def token_scores(self, x: torch.Tensor) -> torch.Tensor:
        """f(x) (...,) for embeddings x (..., d), standardized over the vocabulary's rows."""
        return (self._raw(x) - self.f_mean) / self.f_std

    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Rewards (B,) from response embeddings (B, L, d) and their mask (B, L)."""
        L = inputs_embeds.shape[1]
        scored = torch.zeros(L, dtype=torch.bool, device=inputs_embeds.device)
        scored[self.positions[self.positions < L]] = True
        weight = (attention_mask.bool() & scored).to(inputs_embeds.dtype)
        return (self.token_scores(inputs_embeds) * weight).sum(dim=1) / len(self.positions)


def positional_task(params: PositionalParams, vocab_size: int) -> Task:
    train = _word_prompts(params.num_prompts, params.seed, set())
    held_out = _word_prompts(params.num_eval_prompts, params.seed + 1, {p.text for p in train})

    def build(device: torch.device) -> DirectionModel:
        rm = PositionalRM(vocab_size, params).to(device)
        return ModuleRM(rm, rm.embedding, policy_vocab_size=vocab_size, include_prompt=False)

    return Task("positional", train, held_out, build)


def arithmetic_task(params: ArithmeticParams, vocab_size: int) -> Task:
    """The ``arithmetic`` task; ``vocab_size`` is unused: the reward reads text."""

    def no_model(device: torch.device) -> DirectionModel:
        raise ConfigError(
            "data.task: 'arithmetic' scores text and has no reward model of its own: set "
            f"reward.reward: {{kind: callable, function: {SCORER}}} (and reward.direction_model "
            "for a strategy that reads the reward gradient)"
        )

    train, held_out = arithmetic_prompts(params)
    return Task("arithmetic", train, held_out, no_model)


TASKS: dict[str, tuple[type[BaseModel], Callable[[Any, int], Task]]] = {
    "positional": (PositionalParams, positional_task),
    "arithmetic": (ArithmeticParams, arithmetic_task),
}


def task_problems(name: str, params: dict[str, Any]) -> list[FieldError]:
    """What is wrong with task ``name`` and its ``params``: one ``FieldError`` per problem,
    its field relative to the ``data`` section (``task`` or ``task_params.<param>``); empty
    when both are valid. The one check of a task; the config validation reports it too."""
    if name not in TASKS:
        return [FieldError("task", f"unknown task {name!r}; built-in tasks: {sorted(TASKS)}")]
    model = TASKS[name][0]
    try:
        model.model_validate(params)
    except ValidationError as exc:
        return [
            FieldError(".".join(filter(None, ["task_params", p.field])), p.message)
            for p in validation_messages(exc, model)
        ]
    return []


def parse_task_params(name: str, params: dict[str, Any]) -> BaseModel:
    """Validated parameters of task ``name``; ``ConfigError`` naming the task or parameter."""
    problems = task_problems(name, params)
    if problems:
        lines = [f"  data.{p.field}: {p.message}" for p in problems]
        raise ConfigError(f"invalid task {name!r} or its parameters:\n" + "\n".join(lines))
    return TASKS[name][0].model_validate(params)


def get_task(name: str, params: dict[str, Any], vocab_size: int) -> Task:
    """Build task ``name`` with ``params`` for a policy vocabulary of ``vocab_size``."""
    parsed = parse_task_params(name, params)
    return TASKS[name][1](parsed, vocab_size)
