"""Training the frozen reward models of the word-task settings in-process.

The reward model is a tiny BERT sequence classifier (``adapters.tiny.tiny_seq_classifier``)
over the policy's own vocabulary, trained by mean-squared error to predict a score of
(prompt, response) pairs (``train_reward_model``), or by the Bradley-Terry loss on
preference pairs (``train_preference_model``, setting 8). Its inputs are laid out exactly
as ``adapters.reward_models.SeqClassificationRM`` lays them out when it scores rollouts
(``adapters.rm_inputs.assemble`` with the RM tokenizer's pair template, right padding), so
what it learned is what it sees.
The saved folder (model + the RM tokenizer) is a ``seq_classification`` direction model.

Its fidelity is set by ``RMTrainConfig``: fewer ``examples`` or ``steps``, Gaussian
``label_noise`` on the training scores, or ``label_threshold`` (train on the binary label
1[score >= threshold] only). The held-out fit is always measured against the clean score.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import ConfigDict, Field

from ablations.cache import SpecModel
from adapters.rm_inputs import SpecialTemplate, assemble
from adapters.tiny import tiny_seq_classifier


class RMTrainConfig(SpecModel):
    """Size and training of an in-process reward model; ``label_noise`` and
    ``label_threshold`` (None: off, left out of cache keys) degrade a score-regression RM's
    training labels (module docstring)."""

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
    label_noise: float | None = Field(
        default=None, gt=0.0, description="std of Gaussian noise added to each training score"
    )
    label_threshold: float | None = Field(
        default=None, description="train on 1[score >= threshold] instead of the score"
    )

    def training_labels(self, scores: torch.Tensor) -> torch.Tensor:
        """The labels (N,) float32 the RM is fit to for clean ``scores`` (N,): thresholded,
        then with Gaussian noise drawn from a generator seeded by ``seed + 3``."""
        labels = scores
        if self.label_threshold is not None:
            labels = (scores >= self.label_threshold).to(torch.float32)
        if self.label_noise is not None:
            gen = torch.Generator().manual_seed(self.seed + 3)
            labels = labels + self.label_noise * torch.randn(labels.shape, generator=gen)
        return labels


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


@dataclass(frozen=True)
class _RMParts:
    """A fresh reward model over ``rm_tokenizer``'s vocabulary and its input batcher."""

    model: Any
    batch: Callable[[list[list[int]], list[list[int]]], dict[str, torch.Tensor]]


def _rm_parts(rm_tokenizer: Any, cfg: RMTrainConfig) -> _RMParts:
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

    return _RMParts(model, batch)


def _optimize(
    model: Any, cfg: RMTrainConfig, loss_of: Callable[[list[int]], torch.Tensor], n: int
) -> list[float]:
    """``cfg.steps`` AdamW steps (cosine to 0.1 lr) on ``loss_of(batch indices)``, indices
    drawn with replacement from range(n); returns the losses."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / cfg.steps))
    )
    rng = random.Random(cfg.seed)
    losses = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        for _ in range(cfg.steps):
            loss: Any = loss_of([rng.randrange(n) for _ in range(cfg.batch_size)])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            losses.append(float(loss.detach()))
    model.eval()
    return losses


def _save(model: Any, rm_tokenizer: Any, folder: str | Path) -> None:
    model.requires_grad_(False)
    model.save_pretrained(folder)
    rm_tokenizer.save_pretrained(folder)


def _tail_mean(losses: list[float]) -> float:
    tail = losses[-max(1, len(losses) // 10) :]
    return sum(tail) / len(tail)


def train_reward_model(
    folder: str | Path,
    *,
    rm_tokenizer: Any,
    train_examples: Sequence[tuple[str, str, float]],
    test_examples: Sequence[tuple[str, str, float]],
    cfg: RMTrainConfig,
) -> dict[str, float]:
    """Train on ``train_examples`` by mean-squared error against ``cfg.training_labels`` of
    their scores, save to ``folder``; returns the train MSE (against those labels), the test
    MSE and the test correlation of prediction and clean score."""
    parts = _rm_parts(rm_tokenizer, cfg)
    tp, tr, scores = _encode(rm_tokenizer, train_examples, cfg.eos_rate, cfg.seed)
    ty = cfg.training_labels(scores)
    vp, vr, vy = _encode(rm_tokenizer, test_examples, cfg.eos_rate, cfg.seed + 1)

    def loss_of(idx: list[int]) -> torch.Tensor:
        pred = parts.model(**parts.batch([tp[i] for i in idx], [tr[i] for i in idx])).logits
        return torch.nn.functional.mse_loss(pred[:, 0], ty[idx])

    losses = _optimize(parts.model, cfg, loss_of, len(tp))
    with torch.no_grad():
        pred = parts.model(**parts.batch(vp, vr)).logits[:, 0]
    test_mse = float(torch.nn.functional.mse_loss(pred, vy))
    corr = float(torch.corrcoef(torch.stack([pred, vy]))[0, 1])
    _save(parts.model, rm_tokenizer, folder)
    return {"train_mse": _tail_mean(losses), "test_mse": test_mse, "test_corr": corr}


def train_preference_model(
    folder: str | Path,
    *,
    rm_tokenizer: Any,
    train_pairs: Sequence[tuple[str, str, str]],
    test_pairs: Sequence[tuple[str, str, str]],
    cfg: RMTrainConfig,
) -> tuple[dict[str, float], list[tuple[float, float]]]:
    """Train a Bradley-Terry reward model on (prompt, chosen, rejected) ``train_pairs``
    (loss -log sigmoid(r_chosen - r_rejected)), save to ``folder``; returns the final train
    loss and the held-out label accuracy (chosen scored higher), and the (chosen, rejected)
    rewards of each test pair. Label degradation (``label_noise``, ``label_threshold``) is
    for score regression: here the labeller's noise is the pairs' own; ValueError if set."""
    if cfg.label_noise is not None or cfg.label_threshold is not None:
        raise ValueError(
            "rm.label_noise / rm.label_threshold: a preference RM is fit to labelled pairs; "
            "set the labeller's noise (the setting's temperature) instead"
        )

    def encode(
        pairs: Sequence[tuple[str, str, str]], seed: int
    ) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
        chosen = [(p, c, 0.0) for p, c, _ in pairs]
        rejected = [(p, r, 0.0) for p, _, r in pairs]
        ps, cs, _ = _encode(rm_tokenizer, chosen, cfg.eos_rate, seed)
        _, rs, _ = _encode(rm_tokenizer, rejected, cfg.eos_rate, seed + 7)
        return ps, cs, rs

    parts = _rm_parts(rm_tokenizer, cfg)
    tp, tc, tr = encode(train_pairs, cfg.seed)
    vp, vc, vr = encode(test_pairs, cfg.seed + 1)

    def rewards(p: list[list[int]], c: list[list[int]], r: list[list[int]]) -> torch.Tensor:
        out: torch.Tensor = parts.model(**parts.batch([*p, *p], [*c, *r])).logits[:, 0]
        return out.reshape(2, len(p))

    def loss_of(idx: list[int]) -> torch.Tensor:
        s = rewards([tp[i] for i in idx], [tc[i] for i in idx], [tr[i] for i in idx])
        return -torch.nn.functional.logsigmoid(s[0] - s[1]).mean()

    losses = _optimize(parts.model, cfg, loss_of, len(tp))
    with torch.no_grad():
        s = rewards(vp, vc, vr)
    _save(parts.model, rm_tokenizer, folder)
    fit = {
        "train_bt_loss": _tail_mean(losses),
        "test_label_accuracy": float((s[0] > s[1]).double().mean()),
    }
    return fit, list(zip(s[0].tolist(), s[1].tolist(), strict=True))
