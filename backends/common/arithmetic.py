"""The ``arithmetic`` task: short sums asked through a chat template, checked exactly.

A prompt asks ``What is a + b? Answer with the number only.`` for operands drawn from
``[low, high]``; its label is the sum. The reward (``exact_answer``, a
``adapters.scorers.TextScorer`` taking labels) is 1.0 when the last integer the response
writes equals the label and 0.0 otherwise: a pretrained instruction model answers in its
own words ("5 + 3 = 8.", "The answer is 8."), and its answer is where it ends. Held-out
prompts ask sums of operand pairs that no training prompt asks, in either order.

The task has no reward model of its own: a direction model, when the credit strategy needs
one, comes from the config (``reward.direction_model``), and the reward from
``reward.reward: {kind: callable, function: backends.common.arithmetic:exact_answer}``.
``trl_exact_answer`` is the same check as a TRL reward function, and ``trl_records`` the
prompts as TRL's conversational dataset rows (``write_trl_jsonl`` writes them).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from backends.common.data import Prompt
from backends.common.errors import ConfigError, FieldError

#: The question; ``{a}`` and ``{b}`` are the operands.
TEMPLATE = "What is {a} + {b}? Answer with the number only."
#: Where this module's scorer is, for a config's ``reward.reward.function``.
SCORER = "backends.common.arithmetic:exact_answer"
_INTEGER = re.compile(r"-?\d+")


class ArithmeticParams(BaseModel):
    """Parameters of the ``arithmetic`` task. Held-out prompts are ``num_eval_prompts``
    pairs of distinct operands, each asked in one order; training asks every other ordered
    pair of ``[low, high]`` (``(high - low + 1)**2 - 2 * num_eval_prompts`` of them), or the
    first ``num_prompts`` of them in a shuffled order."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_prompts: int | None = Field(
        default=None, ge=1, description="training prompts; default: every pair not held out"
    )
    num_eval_prompts: int = Field(default=16, ge=1, description="held-out prompts")
    low: int = Field(default=1, ge=0, description="smallest operand")
    high: int = Field(default=9, ge=0, description="largest operand")
    seed: int = Field(default=0, description="seed of the prompts (not the run's seed)")

    @model_validator(mode="after")
    def _enough_pairs(self) -> ArithmeticParams:
        if self.high <= self.low:
            raise ValueError(f"high ({self.high}) must be > low ({self.low})")
        span = self.high - self.low + 1
        distinct = span * (span - 1) // 2
        if self.num_eval_prompts > distinct:
            raise FieldError(
                "num_eval_prompts",
                f"{self.num_eval_prompts} exceeds the {distinct} pairs of distinct operands "
                f"in [{self.low}, {self.high}]",
            )
        left = span * span - 2 * self.num_eval_prompts
        if self.num_prompts is not None and self.num_prompts > left:
            raise FieldError(
                "num_prompts",
                f"{self.num_prompts} exceeds the {left} ordered pairs of [{self.low}, "
                f"{self.high}] left after the held-out ones",
            )
        return self


def _prompt(a: int, b: int) -> Prompt:
    return Prompt(TEMPLATE.format(a=a, b=b), label=a + b)


def arithmetic_prompts(params: ArithmeticParams) -> tuple[list[Prompt], list[Prompt]]:
    """(training, held-out) prompts (see ``ArithmeticParams``): no training prompt asks a
    held-out pair of operands, in either order."""
    rng = random.Random(params.seed)
    operands = range(params.low, params.high + 1)
    distinct = [(a, b) for a in operands for b in operands if a < b]
    rng.shuffle(distinct)
    held_out = [
        (a, b) if rng.random() < 0.5 else (b, a) for a, b in distinct[: params.num_eval_prompts]
    ]
    excluded = {frozenset(pair) for pair in held_out}
    train = [(a, b) for a in operands for b in operands if frozenset((a, b)) not in excluded]
    rng.shuffle(train)
    if params.num_prompts is not None:
        train = train[: params.num_prompts]
    return [_prompt(a, b) for a, b in train], [_prompt(a, b) for a, b in held_out]


def answer_of(response: str) -> int | None:
    """The last integer ``response`` writes (None when it writes none)."""
    found = _INTEGER.findall(response)
    return int(found[-1]) if found else None


def exact_answer(
    prompts: Sequence[str], responses: Sequence[str], labels: Sequence[Any]
) -> list[float]:
    """1.0 where a response's last integer equals its row's label, else 0.0 (a
    ``TextScorer``; ``prompts`` are not read)."""
    if len(responses) != len(labels):
        raise ConfigError(
            f"exact_answer: expected one label per response, got {len(labels)} labels for "
            f"{len(responses)} responses"
        )
    return [float(answer_of(r) == int(label)) for r, label in zip(responses, labels, strict=True)]


def trl_exact_answer(
    prompts: Sequence[Any], completions: Sequence[Any], answer: Sequence[Any], **kwargs: Any
) -> list[float]:
    """``exact_answer`` as a TRL reward function: ``completions`` are strings or
    conversational (a list of messages, the assistant's content read), ``answer`` the
    dataset column of the sums."""
    texts = [c if isinstance(c, str) else "".join(m["content"] for m in c) for c in completions]
    return exact_answer([], texts, answer)


def trl_records(prompts: Sequence[Prompt]) -> list[dict[str, Any]]:
    """TRL conversational rows: ``{"prompt": [user message], "answer": sum}``."""
    return [{"prompt": [{"role": "user", "content": p.text}], "answer": p.label} for p in prompts]


def write_trl_jsonl(params: ArithmeticParams, folder: str | Path) -> tuple[Path, Path]:
    """Write the training and held-out prompts of ``params`` as TRL JSONL files
    ``arithmetic_train.jsonl`` and ``arithmetic_eval.jsonl`` under ``folder``."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    paths = (out / "arithmetic_train.jsonl", out / "arithmetic_eval.jsonl")
    for path, prompts in zip(paths, arithmetic_prompts(params), strict=True):
        path.write_text("".join(json.dumps(r) + "\n" for r in trl_records(prompts)))
    return paths
