"""Short in-process pretraining of a tiny policy, so that RL starts from samples, not noise.

``pretrain_policy(folder, family=..., tokenizer=..., texts=..., ...)`` builds a tiny causal LM
(``adapters.tiny.tiny_causal_lm``) for the tokenizer's vocabulary, trains it with next-token
cross-entropy on ``texts`` (each followed by EOS), and saves model and tokenizer as a plain
Hugging Face folder that ``policy.path`` of the trainer loads, with the tokenizer in its
``tokenizer/`` subfolder (``policy.tokenizer``). Deterministic for given arguments (seeded
init and batches, AdamW, warmup + cosine learning rate).

Why a subfolder: with transformers 5, ``AutoTokenizer.from_pretrained`` on a folder whose
``config.json`` says ``qwen2`` or ``gpt2`` builds that family's tokenizer class, which
replaces the saved pre-tokenizer and decoder (a word-level tokenizer then decodes
``sort 6 0 =`` as ``60=``); a folder without ``config.json`` loads the tokenizer as saved.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from adapters.tiny import tiny_causal_lm

TOKENIZER_DIR = "tokenizer"


class PretrainConfig(BaseModel):
    """How long and how hard the policy is pretrained."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: int = Field(default=200, ge=1)
    batch_size: int = Field(default=32, ge=1)
    lr: float = Field(default=3e-3, gt=0.0)
    warmup_steps: int = Field(default=10, ge=0)
    max_len: int = Field(default=32, ge=2, description="tokens per training sequence (truncation)")
    size: str = Field(default="tiny", description="a shape of adapters.tiny.SIZES")
    seed: int = 0


def _batch(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), L), dtype=torch.long)
    for row, s in enumerate(seqs):
        ids[row, : len(s)] = torch.tensor(list(s), dtype=torch.long)
        mask[row, : len(s)] = 1
    return ids, mask


def pretrain_policy(
    folder: str | Path,
    *,
    family: str,
    tokenizer: Any,
    texts: Sequence[str],
    cfg: PretrainConfig,
) -> list[float]:
    """Build, pretrain and save (to ``folder``) a tiny ``family`` policy; returns the losses.

    The tokenizer must define ``eos_token_id`` and ``pad_token_id``; texts are encoded
    without special tokens and followed by EOS.
    """
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    if eos is None or pad is None:
        raise ValueError("pretrain_policy: the tokenizer needs an eos and a pad token")
    if not texts:
        raise ValueError("pretrain_policy: expected at least one text")
    seqs = [
        [*tokenizer(t, add_special_tokens=False)["input_ids"][: cfg.max_len - 1], eos]
        for t in texts
    ]
    model: Any = tiny_causal_lm(
        family, len(tokenizer), size=cfg.size, seed=cfg.seed, pad_token_id=pad, eos_token_id=eos
    )
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)

    def lr_at(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at)
    rng = random.Random(cfg.seed)
    losses = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        for _ in range(cfg.steps):
            ids, mask = _batch([seqs[rng.randrange(len(seqs))] for _ in range(cfg.batch_size)], pad)
            out = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100))
            optimizer.zero_grad(set_to_none=True)
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            losses.append(float(out.loss.detach()))
    model.eval()
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad
    model.save_pretrained(folder)
    tokenizer.save_pretrained(Path(folder) / TOKENIZER_DIR)
    return losses
