"""Shared helpers of the adapters tests: cached MiniLM/BPE, rollout batches from text."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from adapters.minilm import load_minilm
from adapters.tiny import train_bpe_tokenizer

PROMPTS = ("Tell me about dogs.", "What is the weather like?", "Describe your day.")
RESPONSES = (
    "A happy dog runs in the park with a red ball.",
    "Sunny, with a light breeze.",
    "It's been playing out fine, thank you!",
)
TARGET = "a happy dog playing in the park"


@functools.cache
def minilm() -> tuple[Any, Any]:
    """all-MiniLM-L6-v2 (float32, eval) and its tokenizer, loaded once per session."""
    return load_minilm()


@functools.cache
def minilm_tokenizer() -> Any:
    return minilm()[1]


@functools.cache
def bpe_tokenizer() -> Any:
    """The byte-level BPE policy tokenizer of the tests (600 tokens, TINY_CORPUS)."""
    return train_bpe_tokenizer(vocab_size=600)


def encode(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


def rollout_batch(
    prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], pad: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(prompt_ids, prompt_mask) left-padded and (response_ids, response_mask) right-padded."""
    B = len(prompts)
    P = max(len(p) for p in prompts)
    R = max(max(len(r) for r in responses), 1)
    pid = torch.full((B, P), pad, dtype=torch.long)
    rid = torch.full((B, R), pad, dtype=torch.long)
    pm, rm = torch.zeros_like(pid), torch.zeros_like(rid)
    for b, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        pid[b, P - len(p) :] = torch.tensor(p, dtype=torch.long)
        pm[b, P - len(p) :] = 1
        rid[b, : len(r)] = torch.tensor(r, dtype=torch.long)
        rm[b, : len(r)] = 1
    return pid, pm, rid, rm


def text_batch(
    tokenizer: Any, prompts: Sequence[str] = PROMPTS, responses: Sequence[str] = RESPONSES
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return rollout_batch(encode(tokenizer, prompts), encode(tokenizer, responses))


def central_difference(
    f: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, direction: torch.Tensor, h: float
) -> torch.Tensor:
    """(f(x + h v) - f(x - h v)) / 2h, per row of f's (B,) output."""
    with torch.no_grad():
        return (f(x + h * direction) - f(x - h * direction)) / (2 * h)
