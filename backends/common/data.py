"""Prompts: loading JSONL files, and a resumable, rank-sharded stream of prompt batches."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from backends.common.errors import ConfigError


@dataclass(frozen=True)
class Prompt:
    """One prompt; ``label`` (any JSON value) is handed to text scorers that want it."""

    text: str
    label: Any = None


def load_jsonl(path: str | Path) -> list[Prompt]:
    """Prompts from a JSONL file: one object per line with a string ``prompt``, optional ``label``.

    Blank lines are skipped. A malformed line raises ``ConfigError`` naming file and line.
    """
    prompts: list[Prompt] = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{where}: not valid JSON: {exc}") from exc
            if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
                raise ConfigError(f"{where}: expected an object with a string field 'prompt'")
            unknown = set(record) - {"prompt", "label"}
            if unknown:
                raise ConfigError(
                    f"{where}: unknown fields {sorted(unknown)}; allowed: 'prompt', 'label'"
                )
            prompts.append(Prompt(record["prompt"], record.get("label")))
    if not prompts:
        raise ConfigError(f"{path}: no prompts found")
    return prompts


class PromptSampler:
    """An endless, deterministic stream of batches of prompt indices.

    Epoch ``e`` visits the ``n`` prompts in the order of a permutation drawn from
    ``seed`` and ``e`` alone (identity order when ``shuffle`` is False); a batch may span two
    epochs. The position (epoch, offset) is the whole state: ``state_dict`` /
    ``load_state_dict`` resume the stream exactly.
    """

    def __init__(self, n: int, batch_size: int, *, seed: int, shuffle: bool = True) -> None:
        if n < 1:
            raise ConfigError(f"PromptSampler: expected at least one prompt, got {n}")
        if batch_size < 1:
            raise ConfigError(f"PromptSampler: batch_size must be >= 1, got {batch_size}")
        self.n = n
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.offset = 0
        self._drawn: tuple[int, list[int]] = (-1, [])

    def _order(self, epoch: int) -> list[int]:
        """The prompt order of ``epoch`` (drawn once per epoch)."""
        if self._drawn[0] != epoch:
            if self.shuffle:
                gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
                order = torch.randperm(self.n, generator=gen).tolist()
            else:
                order = list(range(self.n))
            self._drawn = (epoch, order)
        return self._drawn[1]

    def next_batch(self) -> list[int]:
        """The next ``batch_size`` global prompt indices."""
        out: list[int] = []
        while len(out) < self.batch_size:
            order = self._order(self.epoch)
            take = min(self.batch_size - len(out), self.n - self.offset)
            out.extend(order[self.offset : self.offset + take])
            self.offset += take
            if self.offset == self.n:
                self.epoch, self.offset = self.epoch + 1, 0
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "offset": self.offset, "n": self.n, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["n"] != self.n or state["seed"] != self.seed:
            raise ConfigError(
                f"data position: checkpoint was taken over {state['n']} prompts with seed "
                f"{state['seed']}, this run has {self.n} prompts with seed {self.seed}"
            )
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])


def check_shardable(count: int, world_size: int) -> None:
    """``ConfigError`` unless ``count`` prompts (``rollout.prompts_per_step``) split into
    whole, equal shares over ``world_size`` processes; a prompt's group never straddles
    ranks. The one check of it: ``shard`` and ``config.check_batch_split`` call it."""
    if count % world_size:
        raise ConfigError(
            f"rollout.prompts_per_step={count} must be a multiple of the number of "
            f"processes ({world_size}), so that every rank gets whole prompt groups"
        )


def shard(items: list[Any], rank: int, world_size: int) -> list[Any]:
    """Rank ``rank``'s contiguous share of ``items``; ``len(items)`` must divide evenly."""
    check_shardable(len(items), world_size)
    per = len(items) // world_size
    return items[rank * per : (rank + 1) * per]
