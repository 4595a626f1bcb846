"""The length-sweep task of setting 9 (``length_sweep``): one sparse task at any length.

The prompts and vocabulary are those of the target-token task (``word_tasks.target_task``);
a response is ``response_len`` words (24, 96, 192 in configs/ablate/length.yaml). Four
*decisive* positions (``decisive_positions``) sit at 1/8, 3/8, 5/8 and 7/8 of the length, so
the decisive share of the tokens falls as the length grows (4 of 24, 4 of 96, 4 of 192);
the first two form span A, the last two span B.

- The rule (``span_product``) is an interaction of the two spans, not a sum over tokens:
  r(y) = c_A(y) * c_B(y) / 4, where c_A and c_B count the target-category words
  (``word_tasks.TARGET_CATEGORY``) at span A's and span B's positions (r in {0, 1/4, 1/2, 1}).
  A target word at an A position is worth c_B / 4, which the tokens *after* it decide, so
  the reward does not decompose over prefixes: every prefix that ends before span B scores
  0, and the prefix differences of the rule (RED's credit with the rule as its scorer) give
  span A nothing, whatever it holds.
- The reward of a run is the rule itself (``span_checker``, exact); the direction model of
  DATC and the scorer of ``red``/``abc`` is a tiny BERT trained in-process on the rule
  (``span_rm_examples``), as in setting 6, or, to lower its fidelity, on a mix of the rule
  and its additive proxy ``span_sum`` (c_A + c_B) / 4.
- Pretraining texts (``length_task``) hold a target word at rate ``target_rate`` anywhere:
  the untrained skill, with no notion of which positions count. With ``chain_noise`` they
  follow a fixed successor chain instead (``chain_words``): each word is its predecessor's
  successor with probability 1 - ``chain_noise``, else drawn as above, so the pretrained
  policy is peaked (sampling entropy far below log V) while each position still holds a
  target word at about the same rate.
- ``SpanSwapRule`` is the probes' token credit: V_t[v] = r(y with y_t := v), the score each
  token would give at position t with the rest of the response fixed (constant in v away
  from the decisive positions, so their exact credit is 0).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ablations import sparse_tasks, word_tasks

#: The lengths of the sweep (configs/ablate/length.yaml).
SWEEP_LENGTHS: tuple[int, ...] = (24, 96, 192)
#: Where the decisive positions sit, as fractions of the response length (A, A, B, B).
DECISIVE_FRACTIONS: tuple[float, ...] = (1 / 8, 3 / 8, 5 / 8, 7 / 8)
SPAN_SIZE = 2
MIN_LENGTH = 8  # below it two decisive positions would coincide


def decisive_positions(response_len: int) -> tuple[int, ...]:
    """The four decisive positions of a ``response_len``-word response: floor(f * length)
    for f in ``DECISIVE_FRACTIONS`` (24: 3, 9, 15, 21; 96: 12, 36, 60, 84; 192: 24, 72,
    120, 168). ValueError below ``MIN_LENGTH``."""
    if response_len < MIN_LENGTH:
        raise ValueError(f"length_task: response_len must be >= {MIN_LENGTH}, got {response_len}")
    return tuple(int(f * response_len) for f in DECISIVE_FRACTIONS)


def span_counts(words: Sequence[str], response_len: int) -> tuple[int, int]:
    """(c_A, c_B): target-category words at span A's and span B's decisive positions (a
    position past the response's end holds none)."""
    members = set(word_tasks.CATEGORIES[word_tasks.TARGET_CATEGORY])
    hits = [t < len(words) and words[t] in members for t in decisive_positions(response_len)]
    return sum(hits[:SPAN_SIZE]), sum(hits[SPAN_SIZE:])


def span_product(response: str, response_len: int) -> float:
    """r = c_A * c_B / 4 (module docstring) of a response, read as whitespace-split words."""
    c_a, c_b = span_counts(response.split(), response_len)
    return c_a * c_b / SPAN_SIZE**2


def span_checker(prompts: list[str], responses: list[str], response_len: int) -> list[float]:
    """``TextScorer`` of ``span_product`` (bind ``response_len``): the exact reward."""
    if len(prompts) != len(responses):
        raise ValueError("span_checker: expected as many prompts as responses")
    return [span_product(r, response_len) for r in responses]


def _words(rng: random.Random, n: int, rate_at: Sequence[float]) -> list[str]:
    members, others = (
        word_tasks.CATEGORIES[word_tasks.TARGET_CATEGORY],
        word_tasks.non_target_words(),
    )
    return [
        rng.choice(members) if rng.random() < rate_at[t] else rng.choice(others) for t in range(n)
    ]


def successors(seed: int) -> dict[str, str]:
    """The successor chain of the peaked pretraining texts: a seeded random permutation of
    the response words (target and non-target), word -> its successor."""
    vocab = [*word_tasks.CATEGORIES[word_tasks.TARGET_CATEGORY], *word_tasks.non_target_words()]
    shuffled = list(vocab)
    random.Random(seed + 7919).shuffle(shuffled)
    return dict(zip(vocab, shuffled, strict=True))


def chain_words(
    rng: random.Random, n: int, target_rate: float, noise: float, succ: dict[str, str]
) -> list[str]:
    """``n`` words: the first drawn as ``_words`` draws (target with probability
    ``target_rate``), each next one ``succ`` of the one before with probability 1 - ``noise``,
    else drawn like the first."""
    words = _words(rng, 1, [target_rate])
    for _ in range(n - 1):
        if rng.random() < noise:
            words.extend(_words(rng, 1, [target_rate]))
        else:
            words.append(succ[words[-1]])
    return words


def length_task(
    *,
    num_train: int,
    num_held_out: int,
    num_pretrain: int,
    target_rate: float,
    response_len: int,
    seed: int,
    chain_noise: float | None = None,
) -> word_tasks.TaskData:
    """The target-token prompts with ``response_len``-word pretraining responses, each word
    a target word with probability ``target_rate``, or, with ``chain_noise`` in (0, 1],
    following the chain of ``successors(seed)`` (``chain_words``)."""
    decisive_positions(response_len)  # validates the length
    if chain_noise is not None and not 0.0 < chain_noise <= 1.0:
        raise ValueError(f"length_task: chain_noise must be in (0, 1], got {chain_noise}")
    base = word_tasks.target_task(
        num_train=num_train, num_held_out=num_held_out, num_pretrain=0, target_rate=0.0, seed=seed
    )
    rng = random.Random(seed + 6151)
    train = [r["prompt"] for r in base.train]
    rates = [target_rate] * response_len
    succ = successors(seed)

    def response() -> list[str]:
        if chain_noise is None:
            return _words(rng, response_len, rates)
        return chain_words(rng, response_len, target_rate, chain_noise, succ)

    texts = [f"{rng.choice(train)} {' '.join(response())}" for _ in range(num_pretrain)]
    return word_tasks.TaskData(base.train, base.held_out, texts)


def span_sum(response: str, response_len: int) -> float:
    """(c_A + c_B) / 4: the additive proxy of ``span_product`` (same range [0, 1]), a sum over
    the decisive tokens."""
    c_a, c_b = span_counts(response.split(), response_len)
    return (c_a + c_b) / SPAN_SIZE**2


def span_rm_examples(
    prompts: Sequence[str], n: int, seed: int, response_len: int, proxy: float = 0.0
) -> list[tuple[str, str, float]]:
    """(prompt, response, score): per example target-word rates q_A, q_B ~ U[0, 1] at span
    A's and span B's positions and an independent q_o ~ U[0, 1] elsewhere (target words that
    do not count); a sixth are cut short. The score is ``span_product``, or with ``proxy``
    w in (0, 1] (1 - w) ``span_product`` + w ``span_sum``: a direction RM that learned part
    of the rule as a sum over tokens."""
    if not 0.0 <= proxy <= 1.0:
        raise ValueError(f"span_rm_examples: proxy must be in [0, 1], got {proxy}")
    rng = random.Random(seed)
    positions = decisive_positions(response_len)
    out = []
    for _ in range(n):
        q_a, q_b, q_o = rng.random(), rng.random(), rng.random()
        rates = [q_o] * response_len
        for i, t in enumerate(positions):
            rates[t] = q_a if i < SPAN_SIZE else q_b
        words = _words(rng, response_len, rates)
        if rng.random() < 1 / 6:
            words = words[: rng.randint(1, response_len - 1)]
        response = " ".join(words)
        score = span_product(response, response_len)
        if proxy:
            score = (1.0 - proxy) * score + proxy * span_sum(response, response_len)
        out.append((rng.choice(list(prompts)), response, score))
    return out


@dataclass(frozen=True)
class SpanSwapRule:
    """V_t[v] = r(y with y_t := v) for the span product r of ``response_len``-word responses:
    at a decisive position of span A, (c_A - own_t + 1[v target]) * c_B / 4 (B alike);
    elsewhere r(y) for every v. Positions past the response's end and padding ids hold no
    target word.

    ``token_ids``: the policy's id of each word (``sparse_tasks.word_ids(target_words())``).
    """

    token_ids: dict[str, int]
    response_len: int

    def values(
        self, prompts: Sequence[str], response_ids: torch.Tensor, vocab: int
    ) -> torch.Tensor:
        """V (B, T, vocab) float64 for responses ``response_ids`` (B, T)."""
        B, T = sparse_tasks.checked_shape("SpanSwapRule", prompts, response_ids, vocab)
        is_target = torch.zeros(vocab, dtype=torch.float64)
        members = word_tasks.CATEGORIES[word_tasks.TARGET_CATEGORY]
        is_target[[self.token_ids[w] for w in members]] = 1.0
        positions = [t for t in decisive_positions(self.response_len) if t < T]
        own = torch.zeros(B, len(DECISIVE_FRACTIONS), dtype=torch.float64)
        own[:, : len(positions)] = is_target[response_ids[:, positions]]
        c_a, c_b = own[:, :SPAN_SIZE].sum(1), own[:, SPAN_SIZE:].sum(1)  # (B,)
        scale = 1.0 / SPAN_SIZE**2
        out = (c_a * c_b * scale)[:, None, None].expand(B, T, vocab).clone()
        for i, t in enumerate(positions):
            if i < SPAN_SIZE:  # span A: the count of A with y_t := v, times c_B
                swapped, other = (c_a - own[:, i])[:, None] + is_target[None], c_b[:, None]
            else:
                swapped, other = (c_b - own[:, i])[:, None] + is_target[None], c_a[:, None]
            out[:, t] = swapped * other * scale
        return out
