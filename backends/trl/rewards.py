"""A ``DirectionModel`` as a TRL reward function (scalar rewards, no gradient)."""

from __future__ import annotations

from typing import Any

import torch

from adapters.direction import DirectionModel


class DirectionReward:
    """TRL reward function ``f(prompts, completions, completion_ids, **kw) -> list[float]``
    scoring each completion with ``direction`` (its ``rewards``, no gradient).

    The completions are scored from TRL's ``completion_ids`` (policy token ids, right-padded
    here with ``pad_id``); the prompts are re-tokenized from text with ``tokenizer`` (left
    padded), which matters only for direction models that read the prompt. ``__name__``
    names the reward in TRL's metrics (``rewards/<name>/mean``).
    """

    def __init__(self, direction: DirectionModel, tokenizer: Any, name: str) -> None:
        self.direction = direction
        self.tokenizer = tokenizer
        self.__name__ = name

    def __call__(
        self,
        prompts: list[Any],
        completions: list[Any],
        completion_ids: list[list[int]],
        **kwargs: Any,
    ) -> list[float]:
        device = self.direction.reward_embedding.device
        n = max(1, max(len(ids) for ids in completion_ids))
        pad = int(self.tokenizer.pad_token_id)
        response = torch.full((len(completion_ids), n), pad, dtype=torch.long)
        response_mask = torch.zeros((len(completion_ids), n), dtype=torch.long)
        for i, ids in enumerate(completion_ids):
            response[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            response_mask[i, : len(ids)] = 1
        texts = [p if isinstance(p, str) else str(p) for p in prompts]
        enc = self.tokenizer(texts, return_tensors="pt", padding=True, padding_side="left")
        with torch.no_grad():
            out = self.direction.score(
                enc["input_ids"].to(device),
                enc["attention_mask"].to(device),
                response.to(device),
                response_mask.to(device),
                with_grad=False,
            )
        return [float(r) for r in out.rewards]
