"""Training the frozen reward models of settings 1 and 4 in-process.

The reward model is a tiny BERT sequence classifier (``adapters.tiny.tiny_seq_classifier``)
over the policy's own vocabulary, trained by mean-squared error to predict a score of
(prompt, response) pairs. Its inputs are laid out exactly as ``adapters.reward_models.
SeqClassificationRM`` lays them out when it scores rollouts (``adapters.rm_inputs.assemble``
with the RM tokenizer's pair template, right padding), so what it learned is what it sees.
The saved folder (model + the RM tokenizer) is a ``seq_classification`` direction model.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from adapters.rm_inputs import SpecialTemplate, assemble
from adapters.tiny import tiny_seq_classifier


class RMTrainConfig(BaseModel):
    """Size and training of an in-process reward model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    examples: int = Field(
        default=4000, ge=8, description="(prompt, response, score) examples drawn"
    )
    steps: int = Field(default=600, ge=1)
    batch_size: int = Field(default=64, ge=1)
    lr: float = Field(default=3e-3, gt=0.0)
    hidden: int = Field(default=64, ge=4)
    layers: int = Field(default=2, ge=1)
    heads: int = Field(default=4, ge=1)
    eos_rate: float = Field(default=0.7, ge=0.0, le=1.0, description="responses that end with EOS")
    seed: int = 0


def _encode(
    tokenizer: Any, examples: Sequence[tuple[str, str, float]], eos_rate: float, seed: int
) -> tuple[list[list[int]], list[list[int]], torch.Tensor]:
    rng = random.Random(seed)
    prompts, responses = [], []
    for prompt, response, _ in examples:
        prompts.append(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        ids = tokenizer(response, add_special_tokens=False)["input_ids"]
        if not ids or rng.random() < eos_rate:
            ids = [*ids, tokenizer.eos_token_id]
        responses.append(ids)
    return prompts, responses, torch.tensor([s for _, _, s in examples], dtype=torch.float32)


def train_reward_model(
    folder: str | Path,
    *,
    rm_tokenizer: Any,
    train_examples: Sequence[tuple[str, str, float]],
    test_examples: Sequence[tuple[str, str, float]],
    cfg: RMTrainConfig,
) -> dict[str, float]:
    """Train on ``train_examples``, save to ``folder``; returns train/test MSE and the test
    correlation of prediction and score (the caller records them)."""
    template = SpecialTemplate.probe(rm_tokenizer, pair=True)
    pad = rm_tokenizer.pad_token_id
    model: Any = tiny_seq_classifier(
        "bert",
        len(rm_tokenizer),
        hidden=cfg.hidden,
        layers=cfg.layers,
        heads=cfg.heads,
        seed=cfg.seed,
        pad_token_id=pad,
    )
    model.train()

    def batch(p: list[list[int]], r: list[list[int]]) -> dict[str, torch.Tensor]:
        x = assemble(
            p,
            r,
            template,
            pad_id=pad,
            padding_side="right",
            max_length=512,
            device=torch.device("cpu"),
        )
        return {
            "input_ids": x.input_ids,
            "attention_mask": x.attention_mask,
            "token_type_ids": x.token_type_ids,
            "position_ids": x.position_ids,
        }

    tp, tr, ty = _encode(rm_tokenizer, train_examples, cfg.eos_rate, cfg.seed)
    vp, vr, vy = _encode(rm_tokenizer, test_examples, cfg.eos_rate, cfg.seed + 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / cfg.steps))
    )
    rng = random.Random(cfg.seed)
    losses = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        for _ in range(cfg.steps):
            idx = [rng.randrange(len(tp)) for _ in range(cfg.batch_size)]
            pred = model(**batch([tp[i] for i in idx], [tr[i] for i in idx])).logits[:, 0]
            loss: Any = torch.nn.functional.mse_loss(pred, ty[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            losses.append(float(loss.detach()))
    model.eval()
    with torch.no_grad():
        pred = model(**batch(vp, vr)).logits[:, 0]
    test_mse = float(torch.nn.functional.mse_loss(pred, vy))
    corr = float(torch.corrcoef(torch.stack([pred, vy]))[0, 1])
    model.requires_grad_(False)
    model.save_pretrained(folder)
    rm_tokenizer.save_pretrained(folder)
    tail = losses[-max(1, len(losses) // 10) :]
    return {"train_mse": sum(tail) / len(tail), "test_mse": test_mse, "test_corr": corr}
