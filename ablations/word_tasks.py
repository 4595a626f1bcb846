"""The synthetic tasks of settings 1 and 4: vocabularies, prompts, exact scores, RM data.

Both use a word-level tokenizer over a small fixed vocabulary (``word_tokenizer``): text is
words separated by spaces, one token per word.

- ``target_tokens`` (setting 1): a prompt of ``PROMPT_WORDS`` random words and ``":"``; the
  response is up to ``RESPONSE_WORDS`` words. The exact score is the number of response
  words from the target category (``TARGET_CATEGORY``, 8 of the 48 content words) divided
  by ``RESPONSE_WORDS``: the reward depends on those words only, every other token is
  irrelevant to it. Prompts do not change the reward; held-out prompts test the same skill
  in unseen contexts.
- ``sort`` (setting 4): ``"sort 3 1 4 1 ="`` must be answered ``"1 1 3 4"``. The exact
  checker gives 1 for the exact answer and 0 otherwise (``sort_checker``); the direction
  model is trained on the fraction of correct positions (``sort_partial_score``).

Each task draws training and held-out prompts from disjoint pools, and pretraining text
only from the training pool.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from adapters.tiny import EOS_TOKEN, PAD_TOKEN

EOS, PAD, CLS, SEP = EOS_TOKEN, PAD_TOKEN, "[CLS]", "[SEP]"
SPECIALS: tuple[str, ...] = (EOS, PAD, CLS, SEP)

CATEGORIES: dict[str, tuple[str, ...]] = {
    "animals": ("cat", "dog", "horse", "bird", "fish", "cow", "lion", "bear"),
    "colors": ("red", "blue", "green", "yellow", "black", "white", "pink", "brown"),
    "food": ("bread", "apple", "rice", "cheese", "soup", "cake", "milk", "egg"),
    "weather": ("rain", "snow", "wind", "sun", "cloud", "storm", "fog", "ice"),
}
FILLER: tuple[str, ...] = (
    "the",
    "a",
    "and",
    "is",
    "on",
    "in",
    "of",
    "with",
    "very",
    "it",
    "to",
    "was",
    "big",
    "small",
    "old",
    "new",
)
RESPONSE_WORDS = 8
PROMPT_WORDS = 4
SORT_DIGITS = 4


def word_tokenizer(words: Sequence[str], *, pair_template: bool = False) -> Any:
    """A ``PreTrainedTokenizerFast`` with one token per word of ``SPECIALS + words``.

    ``<|endoftext|>`` is eos/bos/unk, ``<pad>`` pad. With ``pair_template`` the tokenizer
    adds ``[CLS] a [SEP]`` / ``[CLS] a [SEP] b [SEP]`` (the reward model's view); without, it
    adds nothing (the policy's view). Both share the same token -> id map.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate([*SPECIALS, *words])}
    if len(vocab) != len(SPECIALS) + len(words):
        raise ValueError("word_tokenizer: words must be distinct and not special tokens")
    tok = Tokenizer(models.WordLevel(vocab, unk_token=EOS))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    extra: dict[str, str] = {}
    if pair_template:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{CLS} $A {SEP}",
            pair=f"{CLS} $A {SEP} $B:1 {SEP}:1",
            special_tokens=[(CLS, vocab[CLS]), (SEP, vocab[SEP])],
        )
        extra = {"cls_token": CLS, "sep_token": SEP}
    fast: Any = PreTrainedTokenizerFast
    return fast(
        tokenizer_object=tok,
        eos_token=EOS,
        bos_token=EOS,
        unk_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[CLS, SEP] if not pair_template else None,
        **extra,
    )


@dataclass(frozen=True)
class TaskData:
    """Prompts (with labels) for training and held-out evaluation, and pretraining texts.

    ``pretrain_texts`` are full ``prompt + " " + response`` strings drawn from the training
    prompt pool only.
    """

    train: list[dict[str, Any]]
    held_out: list[dict[str, Any]]
    pretrain_texts: list[str]


# ---------------------------------------------------------------------- target tokens

#: The category whose words the target-token task rewards.
TARGET_CATEGORY = "weather"


def target_words() -> list[str]:
    """The vocabulary of the target-token task (without special tokens)."""
    words = [*FILLER, ":"]
    for members in CATEGORIES.values():
        words.extend(members)
    return words


def non_target_words() -> list[str]:
    return [w for w in target_words() if w != ":" and w not in CATEGORIES[TARGET_CATEGORY]]


def target_score(response: str) -> float:
    """Target-category words among the first ``RESPONSE_WORDS`` response words, divided by
    ``RESPONSE_WORDS`` (in [0, 1])."""
    members = set(CATEGORIES[TARGET_CATEGORY])
    words = response.split()[:RESPONSE_WORDS]
    return sum(w in members for w in words) / RESPONSE_WORDS


def target_scorer(prompts: list[str], responses: list[str]) -> list[float]:
    """``TextScorer`` of the exact target-token score (see ``target_score``)."""
    if len(prompts) != len(responses):
        raise ValueError("target_scorer: expected as many prompts as responses")
    return [target_score(r) for r in responses]


def target_task(
    *, num_train: int, num_held_out: int, num_pretrain: int, target_rate: float, seed: int
) -> TaskData:
    """Prompts of ``PROMPT_WORDS`` random context words and ":"; pretraining responses hold
    each target-category word with probability ``target_rate`` (the untrained skill)."""
    rng = random.Random(seed)
    context = [w for w in target_words() if w != ":"]
    pool: list[str] = []
    seen: set[str] = set()
    while len(pool) < num_train + num_held_out:
        prompt = " ".join([*rng.sample(context, PROMPT_WORDS), ":"])
        if prompt not in seen:
            seen.add(prompt)
            pool.append(prompt)
    held_out, train = pool[:num_held_out], pool[num_held_out:]
    members, others = CATEGORIES[TARGET_CATEGORY], non_target_words()
    texts = []
    for _ in range(num_pretrain):
        words = [
            rng.choice(members) if rng.random() < target_rate else rng.choice(others)
            for _ in range(RESPONSE_WORDS)
        ]
        texts.append(f"{rng.choice(train)} {' '.join(words)}")
    return TaskData([{"prompt": p} for p in train], [{"prompt": p} for p in held_out], texts)


def target_rm_examples(prompts: Sequence[str], n: int, seed: int) -> list[tuple[str, str, float]]:
    """(prompt, response, exact score) covering what a policy may write: per example a
    target-word rate q ~ U[0, 1] and small word pools (1 to 8 target words, 1 to 8 other
    words), so repetitive responses are seen too; a quarter are cut short."""
    rng = random.Random(seed)
    members, others = CATEGORIES[TARGET_CATEGORY], non_target_words()
    out = []
    for _ in range(n):
        q = rng.random()
        pool_in = rng.sample(members, rng.randint(1, len(members)))
        pool_out = rng.sample(others, rng.randint(1, 8))
        words = [
            rng.choice(pool_in) if rng.random() < q else rng.choice(pool_out)
            for _ in range(RESPONSE_WORDS)
        ]
        if rng.random() < 0.25:
            words = words[: rng.randint(1, RESPONSE_WORDS - 1)]
        response = " ".join(words)
        out.append((rng.choice(list(prompts)), response, target_score(response)))
    return out


# ------------------------------------------------------------------------------- sort


def sort_words() -> list[str]:
    """The vocabulary of the sorting task (without special tokens)."""
    return ["sort", "=", *(str(d) for d in range(10))]


def sort_answer(prompt: str) -> list[str]:
    parts = prompt.split()
    if len(parts) < 3 or parts[0] != "sort" or parts[-1] != "=":
        raise ValueError(f"sort: not a task prompt: {prompt!r}")
    return sorted(parts[1:-1], key=int)


def sort_checker(prompts: list[str], responses: list[str]) -> list[float]:
    """``TextScorer``: 1.0 where the response is exactly the sorted digits, else 0.0."""
    return [float(r.split() == sort_answer(p)) for p, r in zip(prompts, responses, strict=True)]


def sort_partial_score(prompt: str, response: str) -> float:
    """Fraction of positions where the response has the right digit (the direction model's
    training target; a missing or extra word counts as a wrong position)."""
    answer, words = sort_answer(prompt), response.split()
    right = sum(a == w for a, w in zip(answer, words, strict=False))
    return right / max(len(answer), len(words))


def sort_task(*, num_train: int, num_held_out: int, num_pretrain: int, seed: int) -> TaskData:
    """Distinct digit tuples for training and held-out prompts; pretraining texts are
    correctly sorted answers to training-pool tuples only."""
    rng = random.Random(seed)
    pool: list[tuple[str, ...]] = []
    seen: set[tuple[str, ...]] = set()
    while len(pool) < num_train + num_held_out:
        digits = tuple(str(rng.randrange(10)) for _ in range(SORT_DIGITS))
        if digits not in seen:
            seen.add(digits)
            pool.append(digits)
    held_out, train = pool[:num_held_out], pool[num_held_out:]

    def prompt(d: Sequence[str]) -> str:
        return " ".join(["sort", *d, "="])

    texts = []
    for _ in range(num_pretrain):
        p = prompt(rng.choice(train))
        texts.append(f"{p} {' '.join(sort_answer(p))}")
    return TaskData(
        [{"prompt": prompt(d)} for d in train], [{"prompt": prompt(d)} for d in held_out], texts
    )


def sort_rm_examples(prompts: Sequence[str], n: int, seed: int) -> list[tuple[str, str, float]]:
    """(prompt, response, fraction of correct positions): the sorted answer with 0 to
    ``SORT_DIGITS`` positions replaced by random digits, sometimes cut short or extended."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        prompt = rng.choice(list(prompts))
        words = sort_answer(prompt)
        for i in rng.sample(range(len(words)), rng.randint(0, len(words))):
            words[i] = str(rng.randrange(10))
        roll = rng.random()
        if roll < 0.1:
            words = words[: rng.randint(1, len(words) - 1)]
        elif roll < 0.2:
            words = [*words, str(rng.randrange(10))]
        response = " ".join(words)
        out.append((prompt, response, sort_partial_score(prompt, response)))
    return out
