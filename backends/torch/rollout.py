"""Rollout: sampling G responses per prompt with Hugging Face ``generate``.

Layout (the project's convention): a ``RolloutBatch`` holds left-padded prompts (B, P) and
right-padded responses (B, R); ``input_ids = [prompt | response]``. The response mask marks
tokens up to and including the first EOS. Rows of one prompt's group are contiguous.

Sampling is from softmax(logits / temperature) with the rollout config's top-k and top-p
(off by default, and required off by strategies that need the policy statistics): the
generation config is built from scratch with every other logits processor off, so a
model's own defaults (often ``top_k=50``) never apply. DATC's policy statistics are
computed from that same distribution.

Each ``generate`` call runs under its own seed (``derive_seed``) inside ``torch.random.fork_rng``,
so samples depend on (seed, step, position of the prompt chunk in the step's batch) only:
not on the number of ranks (when chunk boundaries line up), nor on what ran before.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from backends.common.response_mask import response_mask_from_eos
from backends.torch.config import RolloutConfig


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed that depends only on ``parts`` (stable across processes and runs)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


@dataclass(frozen=True)
class RolloutBatch:
    """B responses: prompt_ids/prompt_mask (B, P) left-padded, response_ids/response_mask
    (B, R) right-padded (``pad_id`` after the EOS), group (B,) int64 id of the prompt of each
    row (contiguous per group). Masks are bool; every response has at least one token."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    group: torch.Tensor
    pad_id: int

    @property
    def size(self) -> int:
        return int(self.response_ids.shape[0])

    @property
    def prompt_len(self) -> int:
        return int(self.prompt_ids.shape[1])

    @property
    def response_len(self) -> int:
        return int(self.response_ids.shape[1])

    @property
    def input_ids(self) -> torch.Tensor:
        """(B, P + R) prompt and response tokens."""
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        """(B, P + R) int64: 1 at real prompt and response tokens."""
        return torch.cat([self.prompt_mask, self.response_mask], dim=1).long()

    def select(self, rows: torch.Tensor | slice) -> RolloutBatch:
        """Rows ``rows``, with padding columns that no selected row uses trimmed away."""
        pm, rm = self.prompt_mask[rows], self.response_mask[rows]
        p_keep = int(pm.any(dim=0).nonzero().min()) if pm.any() else pm.shape[1]
        r_keep = int(rm.any(dim=0).nonzero().max()) + 1 if rm.any() else 0
        return RolloutBatch(
            self.prompt_ids[rows][:, p_keep:],
            pm[:, p_keep:],
            self.response_ids[rows][:, :r_keep],
            rm[:, :r_keep],
            self.group[rows],
            self.pad_id,
        )

    def micro_batches(self, size: int) -> Iterator[tuple[slice, RolloutBatch]]:
        """Consecutive chunks of at most ``size`` rows: (rows, ``select(rows)``) each.

        A chunk's responses are trimmed to its longest one; ``pad_responses`` brings a
        per-chunk result back to ``response_len`` columns before concatenation.
        """
        if size < 1:
            raise ValueError(f"micro-batch size: expected >= 1, got {size}")
        for start in range(0, self.size, size):
            rows = slice(start, min(self.size, start + size))
            yield rows, self.select(rows)

    @staticmethod
    def cat(parts: Sequence[RolloutBatch]) -> RolloutBatch:
        """Concatenate along the batch, re-padding prompts (left) and responses (right)."""
        if not parts:
            raise ValueError("RolloutBatch.cat: expected at least one batch")
        pad = parts[0].pad_id
        P = max(b.prompt_len for b in parts)
        R = max(b.response_len for b in parts)

        def left(x: torch.Tensor, width: int, value: Any) -> torch.Tensor:
            return torch.nn.functional.pad(x, (width - x.shape[1], 0), value=value)

        def right(x: torch.Tensor, width: int, value: Any) -> torch.Tensor:
            return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)

        return RolloutBatch(
            torch.cat([left(b.prompt_ids, P, pad) for b in parts]),
            torch.cat([left(b.prompt_mask, P, False) for b in parts]),
            torch.cat([right(b.response_ids, R, pad) for b in parts]),
            torch.cat([right(b.response_mask, R, False) for b in parts]),
            torch.cat([b.group for b in parts]),
            pad,
        )


def pad_responses(x: torch.Tensor, length: int) -> torch.Tensor:
    """``x`` (B, R[, ...]) with zeros appended along dim 1 up to ``length`` (>= R) columns."""
    pad = length - x.shape[1]
    if pad < 0:
        raise ValueError(f"pad_responses: expected length >= {x.shape[1]}, got {length}")
    return torch.nn.functional.pad(x, (0, 0) * (x.dim() - 2) + (0, pad))


def encode_prompts(
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    pad_id: int,
    *,
    chat_template: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokenize ``texts`` into left-padded (ids, mask) (B, P): with the tokenizer's special
    tokens, or, with ``chat_template``, as one user turn plus the generation prompt."""
    if chat_template:
        encoded = [
            list(
                tokenizer.apply_chat_template(
                    [{"role": "user", "content": text}],
                    add_generation_prompt=True,
                    tokenize=True,
                    return_dict=False,
                )
            )
            for text in texts
        ]
    else:
        encoded = [tokenizer(text)["input_ids"] for text in texts]
    for text, ids in zip(texts, encoded, strict=True):
        if not ids:
            raise ValueError(f"prompt {text!r} tokenizes to no tokens; nothing to condition on")
    P = max(len(ids) for ids in encoded)
    prompt_ids = torch.full((len(texts), P), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((len(texts), P), dtype=torch.bool)
    for row, ids in enumerate(encoded):
        prompt_ids[row, P - len(ids) :] = torch.tensor(ids, dtype=torch.long)
        prompt_mask[row, P - len(ids) :] = True
    return prompt_ids, prompt_mask


def sampling_config(
    *,
    max_new_tokens: int,
    temperature: float,
    top_k: int,
    top_p: float,
    greedy: bool,
    pad_id: int,
    eos_ids: Sequence[int],
) -> GenerationConfig:
    """A generation config with the temperature, ``top_k`` and ``top_p`` given (0 and 1.0
    mean off) and every other logits processor explicitly off.

    ``top_k`` and ``top_p`` are always set: ``generate`` fills unset fields from the model's
    defaults and then global defaults, which include ``top_k=50``.
    """
    sample = (
        {"do_sample": False}
        if greedy
        else {
            "do_sample": True,
            "temperature": temperature,
            "top_k": top_k,
            "top_p": top_p,
        }
    )
    return GenerationConfig(  # type: ignore[no-untyped-call]
        **sample,
        max_new_tokens=max_new_tokens,
        min_new_tokens=0,
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        typical_p=1.0,
        epsilon_cutoff=0.0,
        eta_cutoff=0.0,
        num_beams=1,
        pad_token_id=pad_id,
        eos_token_id=list(eos_ids),
        return_dict_in_generate=False,
    )


class RolloutEngine(Protocol):
    """Something that samples responses for left-padded prompts."""

    def generate(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        group: torch.Tensor,
        *,
        group_size: int,
        greedy: bool,
        seed: int,
    ) -> RolloutBatch:
        """``group_size`` responses per prompt row, group-contiguous, sampled under ``seed``."""

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Make the engine sample from ``model``'s current weights."""


class HFRolloutEngine:
    """Samples with the training model's own ``generate`` (eval mode, no grad).

    ``synced``: every rank keeps stepping until all ranks' sequences are done (``generate``'s
    ``synced_gpus``), needed when each forward is a collective (FSDP).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        cfg: RolloutConfig,
        *,
        pad_id: int,
        eos_ids: Sequence[int],
        synced: bool = False,
    ) -> None:
        self.model = model
        self.cfg = cfg
        self.synced = synced
        self.pad_id = pad_id
        self.eos_ids = list(eos_ids)

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Nothing to do: ``generate`` runs on the live model."""

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        group: torch.Tensor,
        *,
        group_size: int,
        greedy: bool,
        seed: int,
    ) -> RolloutBatch:
        device = prompt_ids.device
        ids = prompt_ids.repeat_interleave(group_size, dim=0)
        mask = prompt_mask.repeat_interleave(group_size, dim=0)
        gen_cfg = sampling_config(
            max_new_tokens=self.cfg.max_new_tokens,
            temperature=self.cfg.temperature,
            top_k=self.cfg.top_k,
            top_p=self.cfg.top_p,
            greedy=greedy,
            pad_id=self.pad_id,
            eos_ids=self.eos_ids,
        )
        devices = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            out = self.model.generate(  # type: ignore[operator]
                input_ids=ids,
                attention_mask=mask.long(),
                generation_config=gen_cfg,
                synced_gpus=self.synced,
            )
        response = out[:, ids.shape[1] :]
        response_mask = response_mask_from_eos(response, self.eos_ids)
        response = torch.where(response_mask, response, self.pad_id)
        batch = RolloutBatch(
            ids, mask, response, response_mask, group.repeat_interleave(group_size), self.pad_id
        )
        return batch.select(slice(None))
