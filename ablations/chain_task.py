"""The outcome-reward, long-response task of setting 7 (``outcome_chain``).

A reasoning-shaped task with a verifiable final answer: the prompt ``"fib a b :"`` (two
digits) asks for the Fibonacci chain modulo 10 written out as a scratchpad of
``CHAIN_STEPS`` digits, x_1 .. x_S with x_{-1} = a, x_0 = b, x_i = (x_{i-1} + x_{i-2}) mod 10,
followed by ``"="`` and the final answer x_S: ``CHAIN_STEPS + 2`` response words.

- The reward is the exact binary outcome (``chain_checker``): 1 where the word after the
  first ``"="`` is x_S, else 0. The scratchpad is not checked, as a verifiable reward does
  not check a reasoning trace; it only helps the policy reach the answer.
- The direction model (and the scorer of ``red``/``abc``) is trained on that binary label
  only (``chain_rm_examples``): no partial credit, the only reward model a user of a
  verifiable reward can build.
- Pretraining demos (``chain_task``) make a step error at rate ``error_rate`` and carry on
  from the wrong digit, so a demo's answer is right only where its chain is (up to chance
  agreements); a policy imitating them succeeds with probability about (1 - e)^S.
- ``ChainStepRule`` is the probes' token credit for this task: a scratch digit is worth 1
  where it follows from the two digits before it in the response (the prompt's digits for
  the first two), the answer digit where it repeats the last scratch digit. The outcome is
  not a sum of these values (a single error flips it), so the probes read it as the credit
  of the step decisions, not as an exact decomposition of the reward.

Prompts are the 100 pairs (a, b), split into disjoint training and held-out pools; held-out
prompts test the same recurrence from unseen starting pairs. Fibonacci modulo 10 has period
60, so x_S = x_{S mod 60}: the answer can be computed without the chain by a policy that
finds the shortcut, which is part of what the held-out pool measures.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ablations import sparse_tasks, word_tasks

CHAIN_STEPS = 64
DIGITS: tuple[str, ...] = tuple(str(d) for d in range(10))


def chain_words() -> list[str]:
    """The vocabulary of the chain task (without special tokens)."""
    return ["fib", ":", "=", *DIGITS]


def chain_prompt(a: int, b: int) -> str:
    return f"fib {a} {b} :"


def chain_start(prompt: str) -> tuple[int, int]:
    """The two starting digits of a task prompt; ValueError for anything else."""
    parts = prompt.split()
    if (
        len(parts) != 4
        or parts[0] != "fib"
        or parts[3] != ":"
        or not all(p in DIGITS for p in parts[1:3])
    ):
        raise ValueError(f"chain: not a task prompt (expected 'fib a b :'): {prompt!r}")
    return int(parts[1]), int(parts[2])


def chain_values(a: int, b: int, steps: int = CHAIN_STEPS) -> list[int]:
    """x_1 .. x_steps of the recurrence x_i = (x_{i-1} + x_{i-2}) mod 10, x_{-1}=a, x_0=b."""
    out, prev, cur = [], a, b
    for _ in range(steps):
        prev, cur = cur, (prev + cur) % 10
        out.append(cur)
    return out


def chain_answer(prompt: str) -> str:
    """The correct final answer x_S of a task prompt."""
    return str(chain_values(*chain_start(prompt))[-1])


def chain_outcome(prompt: str, response: str) -> float:
    """1.0 where the word after the response's first ``"="`` is the correct answer, else 0.0
    (no ``"="``, or nothing after it, is 0.0)."""
    words = response.split()
    if "=" not in words:
        return 0.0
    i = words.index("=")
    return float(i + 1 < len(words) and words[i + 1] == chain_answer(prompt))


def chain_checker(prompts: list[str], responses: list[str]) -> list[float]:
    """``TextScorer`` of ``chain_outcome``: the exact binary reward of setting 7."""
    if len(prompts) != len(responses):
        raise ValueError("chain_checker: expected as many prompts as responses")
    return [chain_outcome(p, r) for p, r in zip(prompts, responses, strict=True)]


def noisy_chain(a: int, b: int, error_rate: float, rng: random.Random) -> list[int]:
    """A scratchpad of ``CHAIN_STEPS`` digits where each step is, with probability
    ``error_rate``, a uniformly drawn wrong digit; later steps follow from the digits written."""
    out, prev, cur = [], a, b
    for _ in range(CHAIN_STEPS):
        nxt = (prev + cur) % 10
        if rng.random() < error_rate:
            nxt = (nxt + rng.randrange(1, 10)) % 10
        prev, cur = cur, nxt
        out.append(nxt)
    return out


def _response(scratch: Sequence[int], answer: int) -> str:
    return " ".join([*(str(d) for d in scratch), "=", str(answer)])


def chain_task(
    *, num_held_out: int, num_pretrain: int, error_rate: float, seed: int
) -> word_tasks.TaskData:
    """The 100 starting pairs shuffled by ``seed``: ``num_held_out`` held out, the rest for
    training; ``num_pretrain`` demos on training prompts, each with its last scratch digit as
    the answer (``noisy_chain`` at ``error_rate``)."""
    if not 1 <= num_held_out < 100:
        raise ValueError(f"chain_task: num_held_out must be in [1, 99], got {num_held_out}")
    if not 0.0 <= error_rate < 1.0:
        raise ValueError(f"chain_task: error_rate must be in [0, 1), got {error_rate}")
    rng = random.Random(seed)
    pairs = [(a, b) for a in range(10) for b in range(10)]
    rng.shuffle(pairs)
    held_out, train = pairs[:num_held_out], pairs[num_held_out:]
    texts = []
    for _ in range(num_pretrain):
        a, b = rng.choice(train)
        scratch = noisy_chain(a, b, error_rate, rng)
        texts.append(f"{chain_prompt(a, b)} {_response(scratch, scratch[-1])}")
    return word_tasks.TaskData(
        [{"prompt": chain_prompt(a, b)} for a, b in train],
        [{"prompt": chain_prompt(a, b)} for a, b in held_out],
        texts,
    )


def chain_rm_examples(prompts: Sequence[str], n: int, seed: int) -> list[tuple[str, str, float]]:
    """(prompt, response, binary outcome) as a verifiable-reward user would label rollouts:
    per example a step-error rate q ~ U[0, 0.06] (about a quarter of the chains are right);
    the answer is the last scratch digit, or (a tenth of the time) a random digit; a tenth are
    cut short before the answer. The label is ``chain_outcome``, nothing else."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        prompt = rng.choice(list(prompts))
        a, b = chain_start(prompt)
        scratch = noisy_chain(a, b, rng.uniform(0.0, 0.06), rng)
        answer = scratch[-1] if rng.random() >= 0.1 else rng.randrange(10)
        words = _response(scratch, answer).split()
        if rng.random() < 0.1:
            words = words[: rng.randint(1, len(words) - 1)]
        response = " ".join(words)
        out.append((prompt, response, chain_outcome(prompt, response)))
    return out


@dataclass(frozen=True)
class ChainStepRule:
    """The step credit of setting 7 (module docstring): V_t[v] = 1 where v is the digit that
    follows from the response's two preceding digits (t < S; the prompt's digits before the
    response), V_S = 0 (the ``"="``), V_{S+1}[v] = 1 where v is the response's last scratch
    digit; 0 past S + 1. Values are scaled by 1 / (S + 1).

    ``token_ids``: the policy's id of each word (``sparse_tasks.word_ids(chain_words())``).
    """

    token_ids: dict[str, int]

    def values(
        self, prompts: Sequence[str], response_ids: torch.Tensor, vocab: int
    ) -> torch.Tensor:
        """V (B, T, vocab) float64 for responses ``response_ids`` (B, T) of ``prompts``."""
        B, T = sparse_tasks.checked_shape("ChainStepRule", prompts, response_ids, vocab)
        digit_of = torch.full((vocab,), -1, dtype=torch.long)
        digit_ids = torch.tensor([self.token_ids[d] for d in DIGITS], dtype=torch.long)
        digit_of[digit_ids] = torch.arange(10)
        starts = torch.tensor([chain_start(p) for p in prompts], dtype=torch.long).reshape(B, 2)
        written = digit_of[response_ids]  # (B, T), -1 where not a digit
        seq = torch.cat([starts, written], dim=1)  # (B, T + 2): a, b, y_0, y_1, ...
        expected = (seq[:, :-2] + seq[:, 1:-1]) % 10  # (B, T): the digit step t should write
        valid = (seq[:, :-2] >= 0) & (seq[:, 1:-1] >= 0)
        scale = 1.0 / (CHAIN_STEPS + 1)
        out = torch.zeros(B, T, vocab, dtype=torch.float64)
        S = min(CHAIN_STEPS, T)
        out[:, :S].scatter_(
            2, digit_ids[expected[:, :S]].unsqueeze(2), (valid[:, :S] * scale).double().unsqueeze(2)
        )
        if T > CHAIN_STEPS + 1:
            last = written[:, CHAIN_STEPS - 1]
            out[:, CHAIN_STEPS + 1].scatter_(
                1,
                digit_ids[last.clamp(min=0)].unsqueeze(1),
                ((last >= 0) * scale).double().unsqueeze(1),
            )
        return out
