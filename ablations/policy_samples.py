"""What the step-0 policy samples: its sampling entropy and the direction model's fidelity on
its own samples (docs/design.md, "Direction-model fidelity and a peaked policy").

A direction model's held-out fit (``rm_train``) is measured on its training distribution;
what DATC and the RM-reading baselines meet is the policy's samples. ``sample_fit`` draws
``samples_per_prompt`` responses to each prompt from the pretrained policy with the trainer's
own rollout engine (``backends.torch.rollout.HFRolloutEngine``, temperature 1, top-k and
top-p off, as the ablation configs train) and scores them with the exact rule (``truth``)
and with the direction model the runs use (``adapters.config.build_reward_signals`` of the
setting's reward section):

- ``entropy``: the mean over sampled response tokens of the entropy of the policy's
  next-token distribution there (nats; ``adapters.policy.response_logprobs_and_entropy``,
  the trainer's own, as ``entropy_top`` reads it), beside ``log_vocab`` = log V of its LM
  head;
- ``rm_corr``: Pearson correlation of the direction model's reward and the exact score over
  the samples (NaN where either is constant);
- ``rm_pair_accuracy``: over the pairs of samples of one prompt whose exact scores differ,
  the share the direction model orders as the rule does (a tie counts as wrong): what the
  sign of a group advantage formed from the RM would get right (NaN without such pairs);
- ``exact_mean``: the samples' mean exact score (the step-0 reward level).

Deterministic for given arguments; runs under ``torch.random.fork_rng``, so building it
leaves the global random state as it found it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ablations.pretrain import TOKENIZER_DIR
from adapters.config import build_reward_signals
from adapters.policy import response_logprobs_and_entropy
from adapters.scorers import decode_rows
from backends.torch.config import RolloutConfig
from backends.torch.rollout import HFRolloutEngine, RolloutBatch, derive_seed, encode_prompts

#: An exact scorer: (prompts, responses) -> scores.
TextScorer = Callable[[list[str], list[str]], list[float]]


@dataclass(frozen=True)
class SampleFit:
    """The step-0 policy's samples, summarized (module docstring)."""

    samples: int
    entropy: float
    log_vocab: float
    exact_mean: float
    rm_corr: float
    rm_pair_accuracy: float

    def to_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}


def pearson(x: torch.Tensor, y: torch.Tensor) -> float:
    """Pearson correlation of two (N,) tensors; NaN where either is constant."""
    x, y = x.to(torch.float64), y.to(torch.float64)
    dx, dy = x - x.mean(), y - y.mean()
    denom = float(torch.sqrt((dx * dx).sum() * (dy * dy).sum()))
    return float((dx * dy).sum()) / denom if denom > 0 else math.nan


def pair_accuracy(model: torch.Tensor, exact: torch.Tensor, group: torch.Tensor) -> float:
    """Over pairs (i < j) of one group with exact_i != exact_j: the share with
    sign(model_i - model_j) == sign(exact_i - exact_j); NaN without such pairs."""
    same = group.unsqueeze(0) == group.unsqueeze(1)
    upper = torch.ones_like(same).triu(diagonal=1)
    d_exact = exact.unsqueeze(1) - exact.unsqueeze(0)
    d_model = model.unsqueeze(1) - model.unsqueeze(0)
    pairs = same & upper & (d_exact != 0)
    n = int(pairs.sum())
    if n == 0:
        return math.nan
    agree = pairs & (torch.sign(d_model) == torch.sign(d_exact))
    return int(agree.sum()) / n


@dataclass(frozen=True)
class PolicySamples:
    """Responses drawn from a policy (``batch``, the trainer's ``RolloutBatch`` layout, one
    group per prompt), its tokenizer, and its mean sampling ``entropy`` over the response
    tokens with ``log_vocab`` = log V."""

    batch: RolloutBatch
    tokenizer: Any
    entropy: float
    log_vocab: float


def draw_samples(
    policy_dir: Path,
    prompts: Sequence[str],
    *,
    samples_per_prompt: int,
    max_new_tokens: int,
    seed: int,
    chat_template: bool = False,
) -> PolicySamples:
    """``samples_per_prompt`` responses to each of ``prompts`` from the policy in
    ``policy_dir`` (a ``pretrain_policy`` folder), as the trainer samples at temperature 1
    (module docstring); ``chat_template``: each prompt asked as one user turn of the
    tokenizer's chat template, as the trainer's ``data.chat_template``. ValueError without
    prompts."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not prompts:
        raise ValueError("sample_fit: expected at least one prompt")
    with torch.random.fork_rng(devices=[]):
        tokenizer = AutoTokenizer.from_pretrained(policy_dir / TOKENIZER_DIR, local_files_only=True)
        model: Any = AutoModelForCausalLM.from_pretrained(policy_dir, local_files_only=True)
        model.eval()
        pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
        cfg = RolloutConfig(
            group_size=samples_per_prompt, max_new_tokens=max_new_tokens, top_k=0, top_p=1.0
        )
        engine = HFRolloutEngine(model, cfg, pad_id=pad, eos_ids=[eos])
        prompt_ids, prompt_mask = encode_prompts(
            tokenizer, list(prompts), pad, chat_template=chat_template
        )
        batch = engine.generate(
            prompt_ids,
            prompt_mask,
            torch.arange(len(prompts)),
            group_size=samples_per_prompt,
            greedy=False,
            seed=derive_seed("sample_fit", seed),
        )
        with torch.no_grad():
            _, token_entropy = response_logprobs_and_entropy(
                model, batch.input_ids, batch.attention_mask, batch.response_len
            )
    entropy = float(token_entropy[batch.response_mask].to(torch.float64).mean())
    log_vocab = math.log(model.get_output_embeddings().weight.shape[0])
    return PolicySamples(batch, tokenizer, entropy, log_vocab)


def sample_fit(
    policy_dir: Path,
    reward: dict[str, Any],
    truth: TextScorer,
    prompts: Sequence[str],
    *,
    samples_per_prompt: int,
    max_new_tokens: int,
    seed: int,
    chat_template: bool = False,
) -> SampleFit:
    """``SampleFit`` of the samples ``draw_samples`` draws, scored by ``truth`` (on the decoded
    prompt and response texts) and by the direction model of the trainer's ``reward``
    section. ValueError without prompts or direction model."""
    if reward.get("direction_model") is None:
        raise ValueError("sample_fit: the reward section has no direction_model to measure")
    drawn = draw_samples(
        policy_dir,
        prompts,
        samples_per_prompt=samples_per_prompt,
        max_new_tokens=max_new_tokens,
        seed=seed,
        chat_template=chat_template,
    )
    batch, tokenizer = drawn.batch, drawn.tokenizer
    texts = decode_rows(tokenizer, batch.prompt_ids, batch.prompt_mask)
    responses = decode_rows(tokenizer, batch.response_ids, batch.response_mask)
    exact = torch.tensor(truth(texts, responses), dtype=torch.float64)
    with torch.random.fork_rng(devices=[]):
        signals = build_reward_signals(reward, tokenizer)
        assert signals.direction_model is not None
        with torch.no_grad():
            scored = signals.direction_model.score(
                batch.prompt_ids,
                batch.prompt_mask,
                batch.response_ids,
                batch.response_mask,
                with_grad=False,
            )
    rm = scored.rewards.to(torch.float64)
    return SampleFit(
        samples=batch.size,
        entropy=drawn.entropy,
        log_vocab=drawn.log_vocab,
        exact_mean=float(exact.mean()),
        rm_corr=pearson(rm, exact),
        rm_pair_accuracy=pair_accuracy(rm, exact, batch.group),
    )
