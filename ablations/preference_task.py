"""The learned-preference task of setting 8 (``preference``).

The shape of an RLHF run: the policy is trained on a Bradley-Terry reward model fit to
preference pairs, and the preferences come from a hidden rule that the reward model only
approximates. The prompts and vocabulary are those of the target-token task
(``word_tasks.target_task``); responses are ``RESPONSE_WORDS`` words.

- The hidden rule (``hidden_score``) is an interaction between two spans, not a sum over
  tokens: h(y) = min(c_1, c_2) / H, where c_1 counts the ``FIRST`` category's words in the
  first half (positions 0 .. H - 1, H = ``RESPONSE_WORDS // 2``) and c_2 the ``SECOND``
  category's words in the second half. A word helps only while its span is the shorter one.
- The labeller (``preference_pairs``) prefers response a to b with probability
  sigmoid((h(a) - h(b)) / ``temperature``): noisy near ties, as human labels are.
- The reward model is trained on those labels only (``rm_train.train_preference_model``);
  its held-out pair accuracy against the hidden rule is recorded. In training, the policy is
  scored by the learned RM; at evaluation also by the hidden rule (``hidden_scorer``), so
  over-optimisation of the RM shows as a gap between the two.
- ``PreferenceSwapRule`` is the probes' token credit: V_t[v] = h(y with y_t replaced by v),
  the hidden score each token would give at position t, the rest of the response fixed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ablations import sparse_tasks, word_tasks

RESPONSE_WORDS = 24
HALF = RESPONSE_WORDS // 2
FIRST, SECOND = "weather", "animals"


def hidden_score(response: str) -> float:
    """h = min(c_1, c_2) / HALF for the first ``RESPONSE_WORDS`` words (module docstring)."""
    words = response.split()[:RESPONSE_WORDS]
    first = set(word_tasks.CATEGORIES[FIRST])
    second = set(word_tasks.CATEGORIES[SECOND])
    c1 = sum(w in first for w in words[:HALF])
    c2 = sum(w in second for w in words[HALF:])
    return min(c1, c2) / HALF


def hidden_scorer(prompts: list[str], responses: list[str]) -> list[float]:
    """``TextScorer`` of ``hidden_score`` (the held-out metric of setting 8)."""
    if len(prompts) != len(responses):
        raise ValueError("hidden_scorer: expected as many prompts as responses")
    return [hidden_score(r) for r in responses]


def _other_words() -> list[str]:
    members = set(word_tasks.CATEGORIES[FIRST]) | set(word_tasks.CATEGORIES[SECOND])
    return [w for w in word_tasks.target_words() if w != ":" and w not in members]


def draw_response(rng: random.Random, q1: float, q2: float) -> str:
    """``RESPONSE_WORDS`` words: each a ``FIRST`` word with probability q1, else a ``SECOND``
    word with probability q2, else another word, at every position (both halves)."""
    first, second = word_tasks.CATEGORIES[FIRST], word_tasks.CATEGORIES[SECOND]
    others = _other_words()
    words = []
    for _ in range(RESPONSE_WORDS):
        u = rng.random()
        if u < q1:
            words.append(rng.choice(first))
        elif u < q1 + q2:
            words.append(rng.choice(second))
        else:
            words.append(rng.choice(others))
    return " ".join(words)


def preference_task(
    *, num_train: int, num_held_out: int, num_pretrain: int, rate: float, seed: int
) -> word_tasks.TaskData:
    """The target-token prompts; pretraining responses hold each span category's words at
    ``rate`` anywhere (the untrained skill: no notion of which half counts)."""
    if not 0.0 <= 2 * rate <= 1.0:
        raise ValueError(f"preference_task: rate must be in [0, 0.5], got {rate}")
    base = word_tasks.target_task(
        num_train=num_train, num_held_out=num_held_out, num_pretrain=0, target_rate=0.0, seed=seed
    )
    rng = random.Random(seed + 104729)
    train = [r["prompt"] for r in base.train]
    texts = [f"{rng.choice(train)} {draw_response(rng, rate, rate)}" for _ in range(num_pretrain)]
    return word_tasks.TaskData(base.train, base.held_out, texts)


@dataclass(frozen=True)
class PreferencePair:
    """One labelled comparison: ``chosen`` was preferred to ``rejected`` for ``prompt``."""

    prompt: str
    chosen: str
    rejected: str


def preference_pairs(
    prompts: Sequence[str], n: int, seed: int, temperature: float
) -> list[PreferencePair]:
    """``n`` pairs of responses to one prompt, each drawn with its own rates q1, q2 ~
    U[0, 0.5] (a sixth cut short), labelled by the noisy hidden-rule labeller: a is chosen
    with probability sigmoid((h(a) - h(b)) / temperature)."""
    if temperature <= 0:
        raise ValueError(f"preference_pairs: temperature must be > 0, got {temperature}")
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        prompt = rng.choice(list(prompts))
        a, b = (_draw_for_rm(rng) for _ in range(2))
        p_a = 1.0 / (1.0 + math.exp(-(hidden_score(a) - hidden_score(b)) / temperature))
        out.append(
            PreferencePair(prompt, a, b) if rng.random() < p_a else PreferencePair(prompt, b, a)
        )
    return out


def _draw_for_rm(rng: random.Random) -> str:
    words = draw_response(rng, rng.uniform(0.0, 0.5), rng.uniform(0.0, 0.5)).split()
    if rng.random() < 1 / 6:
        words = words[: rng.randint(1, RESPONSE_WORDS - 1)]
    return " ".join(words)


def rule_agreement(pairs: Sequence[PreferencePair], scores: Sequence[tuple[float, float]]) -> float:
    """The fraction of ``pairs`` with h(chosen) != h(rejected) where ``scores`` (the RM's
    (chosen, rejected) rewards) order the two responses as the hidden rule does."""
    agree = total = 0
    for pair, (s_c, s_r) in zip(pairs, scores, strict=True):
        h_c, h_r = hidden_score(pair.chosen), hidden_score(pair.rejected)
        if h_c != h_r:
            total += 1
            agree += (s_c > s_r) == (h_c > h_r)
    return agree / total if total else float("nan")


@dataclass(frozen=True)
class PreferenceSwapRule:
    """V_t[v] = h(y with y_t := v) for t < ``RESPONSE_WORDS`` (0 past it): the hidden score
    each token would give at position t with the rest of the response fixed (padding and
    positions past the response's end count as other words).

    ``token_ids``: the policy's id of each word (``sparse_tasks.word_ids(target_words())``).
    """

    token_ids: dict[str, int]

    def values(
        self, prompts: Sequence[str], response_ids: torch.Tensor, vocab: int
    ) -> torch.Tensor:
        """V (B, T, vocab) float64 for responses ``response_ids`` (B, T)."""
        B, T = sparse_tasks.checked_shape("PreferenceSwapRule", prompts, response_ids, vocab)
        is_first = torch.zeros(vocab, dtype=torch.float64)
        is_second = torch.zeros(vocab, dtype=torch.float64)
        is_first[[self.token_ids[w] for w in word_tasks.CATEGORIES[FIRST]]] = 1.0
        is_second[[self.token_ids[w] for w in word_tasks.CATEGORIES[SECOND]]] = 1.0
        L = min(T, RESPONSE_WORDS)
        in_first_half = (torch.arange(L) < HALF).to(torch.float64)  # (L,)
        y = response_ids[:, :L]
        own1 = is_first[y] * in_first_half  # (B, L): y_t counts in c_1
        own2 = is_second[y] * (1.0 - in_first_half)
        c1, c2 = own1.sum(1), own2.sum(1)  # (B,)
        # counts with y_t replaced by v: (B, L, vocab)
        c1_swap = (c1[:, None] - own1)[:, :, None] + is_first[None, None] * in_first_half[
            None, :, None
        ]
        c2_swap = (c2[:, None] - own2)[:, :, None] + is_second[None, None] * (1.0 - in_first_half)[
            None, :, None
        ]
        out = torch.zeros(B, T, vocab, dtype=torch.float64)
        out[:, :L] = torch.minimum(c1_swap, c2_swap) / HALF
        return out
