"""The credit-samples file of a run folder: ``credit_samples.jsonl``, one record per recorded step.

A record::

    {"step": 10, "strategy": "datc", "compare": ["uniform"],
     "samples": [{"prompt": "...", "tokens": ["a", " b"], "reward": 0.5, "advantage": 1.2,
                  "token_advantages": {"datc": [1.9, 0.5], "uniform": [1.2, 1.2]}}]}

``strategy`` labels the run's own credit, ``compare`` the other strategies computed for the
same responses at the same policy (in that order); ``token_advantages`` holds one value
A_t per token for each of them. A strategy that reads a direction model adds the step's
``agreement`` of that model with the reward (``StepAgreement``: docs/design.md, "Trusting
the direction model"), e.g. ``{"direction_is_reward": false, "agreement": 0.41, "groups": 4,
"skipped": 0}``. The token weight shown everywhere is w_t = A_t / A (1 is
GRPO's uniform share; undefined where A = 0). Values are stored to 6 significant digits.

The file is append-only and read like ``metrics.jsonl``: a last line cut short by a kill
is left out; on resume from step k, records after k are dropped (``SamplesWriter``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from backends.common.credit import AgreementMetrics
from backends.common.jsonl import read_jsonl, truncate_jsonl

SAMPLES_FILE = "credit_samples.jsonl"


class ResponseSample(BaseModel):
    """One recorded response: its prompt, tokens (as text), reward, A and A_t per strategy."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt: str
    tokens: list[str]
    reward: float = Field(allow_inf_nan=False)
    advantage: float = Field(allow_inf_nan=False)
    token_advantages: dict[str, list[float]]

    @model_validator(mode="after")
    def _one_value_per_token(self) -> ResponseSample:
        for label, values in self.token_advantages.items():
            if len(values) != len(self.tokens):
                raise ValueError(
                    f"token_advantages[{label!r}]: {len(values)} values for "
                    f"{len(self.tokens)} tokens (expected one per token)"
                )
            if not all(math.isfinite(v) for v in values):
                raise ValueError(f"token_advantages[{label!r}]: expected finite numbers")
        return self

    def weights(self, label: str) -> list[float | None]:
        """w_t = A_t / A of strategy ``label``; None everywhere when A = 0."""
        a = self.advantage
        return [None if a == 0 else v / a for v in self.token_advantages[label]]


class StepAgreement(BaseModel):
    """The direction model against the reward on a recorded step (``AgreementMetrics``):
    the reward is the model's own (``direction_is_reward``), or the mean within-group
    Spearman ``agreement`` (None before any group with varying reward) over ``groups``
    groups, ``skipped`` with constant reward; with a gate its ``ema`` and ``alpha``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    direction_is_reward: bool
    agreement: float | None = Field(default=None, ge=-1.0, le=1.0)
    groups: int = Field(default=0, ge=0)
    skipped: int = Field(default=0, ge=0)
    ema: float | None = Field(default=None, ge=-1.0, le=1.0)
    alpha: float | None = Field(default=None, ge=0.0, le=1.0)

    @classmethod
    def of(cls, measured: AgreementMetrics) -> StepAgreement:
        """The record of one step's ``AgreementMetrics`` (NaN becomes None)."""
        if measured.direction_is_reward:
            return cls(direction_is_reward=True)
        finite = None if math.isnan(measured.value) else _round(measured.value)
        return cls(
            direction_is_reward=False,
            agreement=finite,
            groups=measured.groups,
            skipped=measured.skipped,
            ema=None if measured.ema is None else _round(measured.ema),
            alpha=None if measured.alpha is None else _round(measured.alpha),
        )

    def describe(self) -> str:
        """One line for a reader, e.g. "direction model vs reward: rho = 0.412 over 4 groups
        (1 skipped: constant reward); gate EMA 0.380, alpha 0.450"."""
        if self.direction_is_reward:
            return "the direction model is the reward (agreement 1 by construction)"
        text = "direction model vs reward: "
        if self.agreement is None:
            text += f"no group with varying reward ({self.skipped} skipped)"
        else:
            text += f"rho = {self.agreement:.3f} over {self.groups} groups"
            if self.skipped:
                text += f" ({self.skipped} skipped: constant reward)"
        if self.alpha is not None:
            ema = "none yet" if self.ema is None else f"{self.ema:.3f}"
            text += f"; gate EMA {ema}, alpha {self.alpha:.3f}"
        return text


class StepSamples(BaseModel):
    """The samples of one recorded step (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    step: int = Field(ge=0)
    strategy: str
    compare: list[str] = Field(default_factory=list)
    samples: list[ResponseSample]
    agreement: StepAgreement | None = None

    @property
    def labels(self) -> list[str]:
        """The run's own strategy, then the compared ones."""
        return [self.strategy, *self.compare]

    @model_validator(mode="after")
    def _every_strategy_everywhere(self) -> StepSamples:
        for i, sample in enumerate(self.samples):
            if sorted(sample.token_advantages) != sorted(self.labels):
                raise ValueError(
                    f"samples.{i}.token_advantages: has {sorted(sample.token_advantages)}, "
                    f"expected the strategy and the compared ones {sorted(self.labels)}"
                )
        return self


def _round(x: float) -> float:
    return float(f"{x:.6g}")


def response_samples(
    *,
    prompts: Sequence[str],
    tokens: Sequence[Sequence[str]],
    rewards: torch.Tensor,
    advantages: torch.Tensor,
    token_advantages: dict[str, torch.Tensor],
    mask: torch.Tensor,
) -> list[ResponseSample]:
    """The samples of n responses: ``prompts`` (n,), ``tokens`` (n, their valid tokens' text),
    ``rewards`` and ``advantages`` (n,), ``token_advantages`` label -> (n, T) and the
    response ``mask`` (n, T) (the valid tokens, as many as each row of ``tokens``)."""
    out = []
    for i, (prompt, toks) in enumerate(zip(prompts, tokens, strict=True)):
        valid = mask[i].bool()
        if int(valid.sum()) != len(toks):
            raise ValueError(f"response {i}: {len(toks)} token texts for {int(valid.sum())} tokens")
        out.append(
            ResponseSample(
                prompt=prompt,
                tokens=list(toks),
                reward=_round(float(rewards[i])),
                advantage=_round(float(advantages[i])),
                token_advantages={
                    label: [_round(v) for v in adv[i][valid].tolist()]
                    for label, adv in token_advantages.items()
                },
            )
        )
    return out


def pick_rows(advantages: torch.Tensor, group_size: int, count: int) -> list[int]:
    """``count`` rows (fewer if the batch is smaller) of a batch of contiguous groups of
    ``group_size``: groups in order, those with a non-zero advantage first; from each, the
    highest and the lowest A alternately; each group's rows listed from the highest A."""
    adv = advantages.tolist()
    groups = [list(range(s, s + group_size)) for s in range(0, len(adv), group_size)]
    groups.sort(key=lambda rows: not any(adv[r] != 0 for r in rows))  # stable
    chosen: list[int] = []
    for rows in groups:
        take = min(len(rows), count - len(chosen))
        if take <= 0:
            break
        by_a = sorted(rows, key=lambda r: -adv[r])
        picked = by_a[: (take + 1) // 2] + by_a[len(by_a) - take // 2 :]
        chosen += sorted(picked, key=lambda r: -adv[r])
    return chosen


def _problem(loc: tuple[int | str, ...], msg: str) -> str:
    """One validation problem as ``dotted.field: message`` (no field: the message alone)."""
    msg = msg.removeprefix("Value error, ")
    return f"{'.'.join(map(str, loc))}: {msg}" if loc else msg


def read_samples(path: str | Path) -> list[StepSamples]:
    """Every record of a credit-samples file, in order; ``ValueError`` naming the file, the
    record's line and the bad field when a record is not a ``StepSamples``."""
    out = []
    for n, raw in enumerate(read_jsonl(path), start=1):
        try:
            out.append(StepSamples.model_validate(raw))
        except ValidationError as exc:
            problems = "; ".join(_problem(e["loc"], e["msg"]) for e in exc.errors())
            raise ValueError(f"{path}: record {n}: {problems}") from None
    return out


class SamplesWriter:
    """Appends ``StepSamples`` to ``run_dir / SAMPLES_FILE`` on the logging rank (a no-op
    elsewhere). Records after ``start_step`` are dropped when it opens (all of them from 0),
    as the metrics are: a resumed run records those steps again."""

    def __init__(self, run_dir: str | Path, *, start_step: int, enabled: bool) -> None:
        self.path = Path(run_dir) / SAMPLES_FILE
        self.enabled = enabled
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            truncate_jsonl(self.path, start_step if start_step else -1)

    def write(self, record: StepSamples) -> None:
        if not self.enabled:
            return
        line = json.dumps(record.model_dump(mode="json", exclude_none=True), ensure_ascii=False)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
