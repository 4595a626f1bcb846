"""The sparse-credit tasks of settings 5 and 6: long responses, a few scored positions.

Both use the word vocabulary of the target-token task (``word_tasks.target_words``) and its
prompts (``PROMPT_WORDS`` random words and ``":"``); responses are ``SPARSE_WORDS`` words,
and only the words at ``SCORED_POSITIONS`` count: 3 of 24 tokens carry all of the reward
(docs/design.md, "When token credit pays off").

- ``positional_sparse`` (setting 5): the reward is the built-in ``positional`` reward model
  (``backends.common.tasks.PositionalRM``, a frozen random MLP over a random embedding
  table): r = (1/|S|) sum_{t in S, t < n} f(E[y_t]). It is exact: the direction model is
  the rule. ``positional_reward_model`` is its ``kind: module`` factory.
- ``keyword_sparse`` (setting 6): the exact score is the fraction of scored positions that
  hold a target-category word (``keyword_score``); the reward and the direction come from
  a tiny BERT trained in-process on that score (``keyword_rm_examples``), so the direction
  is learned, not exact, as in setting 1.

``TokenRule`` is the exact per-token decomposition of a task's score, from which the probes
(``ablations.credit_probes``) compute the exact token credit.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from ablations import word_tasks
from backends.common.tasks import PositionalParams, PositionalRM

SPARSE_WORDS = 24
SCORED_POSITIONS: tuple[int, ...] = (2, 9, 17)


class TokenRule(Protocol):
    """Per-token values V_t[v] behind a task's score r(y) = sum_t V_t[y_t] (the probes' token
    credit). V_t may depend on the response's tokens before t (``chain_task.ChainStepRule``)."""

    def values(
        self, prompts: Sequence[str], response_ids: torch.Tensor, vocab: int
    ) -> torch.Tensor:
        """V (B, T, vocab) float64: the score that token v at response position t adds, for
        each prompt and its response ``response_ids`` (B, T) int (B = len(prompts))."""
        ...


@dataclass(frozen=True)
class PositionTokenRule:
    """V_t[v] = scale * per_token[v] at the positions in ``positions``, 0 elsewhere.

    ``per_token`` (V0,) float: the value of each policy token id (ids >= V0 are worth 0).
    """

    per_token: torch.Tensor
    positions: tuple[int, ...]
    scale: float

    def values(
        self, prompts: Sequence[str], response_ids: torch.Tensor, vocab: int
    ) -> torch.Tensor:
        length = int(response_ids.shape[1])
        out = torch.zeros(len(prompts), length, vocab, dtype=torch.float64)
        row = torch.zeros(vocab, dtype=torch.float64)
        n = min(vocab, int(self.per_token.shape[0]))
        row[:n] = self.per_token[:n].to(torch.float64) * self.scale
        for t in self.positions:
            if t < length:
                out[:, t] = row
        return out


@dataclass(frozen=True)
class SortTokenRule:
    """Sorting (setting 4): V_t[v] = 1[v is the t-th sorted digit] / ``SORT_DIGITS``: the
    per-position correctness behind the direction model's training target."""

    token_ids: dict[str, int]

    def values(
        self, prompts: Sequence[str], response_ids: torch.Tensor, vocab: int
    ) -> torch.Tensor:
        length = int(response_ids.shape[1])
        out = torch.zeros(len(prompts), length, vocab, dtype=torch.float64)
        for b, prompt in enumerate(prompts):
            for t, digit in enumerate(word_tasks.sort_answer(prompt)[:length]):
                out[b, t, self.token_ids[digit]] = 1.0 / word_tasks.SORT_DIGITS
        return out


def checked_shape(
    rule: str, prompts: Sequence[str], response_ids: torch.Tensor, vocab: int
) -> tuple[int, int]:
    """(B, T) of ``response_ids`` for a ``TokenRule``'s ``values``; ValueError naming
    ``rule`` where there is not one prompt per row or an id is not below ``vocab``."""
    B, T = response_ids.shape
    if len(prompts) != B:
        raise ValueError(f"{rule}: {len(prompts)} prompts for response_ids of {B} rows")
    if response_ids.numel() and int(response_ids.max()) >= vocab:
        raise ValueError(f"{rule}: response_ids hold ids >= vocab ({vocab})")
    return B, T


def word_ids(words: Sequence[str]) -> dict[str, int]:
    """The ids ``word_tasks.word_tokenizer(words)`` gives each word (specials first)."""
    return {w: i for i, w in enumerate([*word_tasks.SPECIALS, *words])}


def target_indicator(words: Sequence[str]) -> torch.Tensor:
    """(len(SPECIALS) + len(words),) float64: 1 at the ids of target-category words."""
    ids = word_ids(words)
    out = torch.zeros(len(ids), dtype=torch.float64)
    for w in word_tasks.CATEGORIES[word_tasks.TARGET_CATEGORY]:
        out[ids[w]] = 1.0
    return out


def target_rule() -> PositionTokenRule:
    """Setting 1: V_t[v] = 1[v is a target word] / RESPONSE_WORDS for t < RESPONSE_WORDS."""
    return PositionTokenRule(
        target_indicator(word_tasks.target_words()),
        tuple(range(word_tasks.RESPONSE_WORDS)),
        1.0 / word_tasks.RESPONSE_WORDS,
    )


def keyword_rule(positions: tuple[int, ...] = SCORED_POSITIONS) -> PositionTokenRule:
    """Setting 6: V_t[v] = 1[v is a target word] / |S| for t in S."""
    return PositionTokenRule(
        target_indicator(word_tasks.target_words()), positions, 1.0 / len(positions)
    )


def positional_rule(rm: PositionalRM) -> PositionTokenRule:
    """Setting 5: V_t[v] = f(E[v]) / |S| for t in S, from the frozen positional RM."""
    with torch.no_grad():
        f = rm.token_scores(rm.embedding).double()
    positions = tuple(int(t) for t in rm.positions.tolist())
    return PositionTokenRule(f, positions, 1.0 / len(positions))


def positional_reward_model(
    vocab_size: int, positions: list[int], embed_dim: int, seed: int
) -> tuple[PositionalRM, torch.Tensor]:
    """``kind: module`` factory of setting 5: the positional RM and its embedding table."""
    rm = PositionalRM(
        vocab_size, PositionalParams(positions=tuple(positions), embed_dim=embed_dim, seed=seed)
    )
    return rm, rm.embedding.detach()


def keyword_score(response: str, positions: tuple[int, ...] = SCORED_POSITIONS) -> float:
    """Fraction of the scored positions whose response word is a target-category word
    (a position past the response's end counts as a miss)."""
    members = set(word_tasks.CATEGORIES[word_tasks.TARGET_CATEGORY])
    words = response.split()
    return sum(t < len(words) and words[t] in members for t in positions) / len(positions)


def keyword_scorer(prompts: list[str], responses: list[str]) -> list[float]:
    """``TextScorer`` of ``keyword_score``."""
    if len(prompts) != len(responses):
        raise ValueError("keyword_scorer: expected as many prompts as responses")
    return [keyword_score(r) for r in responses]


def sparse_task(
    *,
    num_train: int,
    num_held_out: int,
    num_pretrain: int,
    target_rate: float,
    seed: int,
    response_words: int = SPARSE_WORDS,
) -> word_tasks.TaskData:
    """The target-token prompts (``word_tasks.target_task``) with ``response_words``-word
    pretraining responses: each word a target word with probability ``target_rate``."""
    base = word_tasks.target_task(
        num_train=num_train, num_held_out=num_held_out, num_pretrain=0, target_rate=0.0, seed=seed
    )
    rng = random.Random(seed + 7919)
    members = word_tasks.CATEGORIES[word_tasks.TARGET_CATEGORY]
    others = word_tasks.non_target_words()
    train = [r["prompt"] for r in base.train]
    texts = []
    for _ in range(num_pretrain):
        words = [
            rng.choice(members) if rng.random() < target_rate else rng.choice(others)
            for _ in range(response_words)
        ]
        texts.append(f"{rng.choice(train)} {' '.join(words)}")
    return word_tasks.TaskData(base.train, base.held_out, texts)


def keyword_rm_examples(
    prompts: Sequence[str],
    n: int,
    seed: int,
    positions: tuple[int, ...] = SCORED_POSITIONS,
    response_words: int = SPARSE_WORDS,
) -> list[tuple[str, str, float]]:
    """(prompt, response, ``keyword_score``): target words at the scored positions with a
    rate q_s ~ U[0, 1] and elsewhere with an independent rate q_o ~ U[0, 1] (so the model
    sees target words that do not count); a sixth are cut short."""
    rng = random.Random(seed)
    members, others = (
        word_tasks.CATEGORIES[word_tasks.TARGET_CATEGORY],
        word_tasks.non_target_words(),
    )
    scored = set(positions)
    out = []
    for _ in range(n):
        q_s, q_o = rng.random(), rng.random()
        words = [
            rng.choice(members)
            if rng.random() < (q_s if t in scored else q_o)
            else rng.choice(others)
            for t in range(response_words)
        ]
        if rng.random() < 1 / 6:
            words = words[: rng.randint(1, response_words - 1)]
        response = " ".join(words)
        out.append((rng.choice(list(prompts)), response, keyword_score(response, positions)))
    return out
