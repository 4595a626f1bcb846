"""Building the policy (a local HF folder, a GGUF file or a built-in tiny preset) and its
tokenizer, and switching its gradient checkpointing on around the training forward."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from adapters.config import DTYPES
from adapters.gguf import load_gguf
from adapters.tiny import tiny_causal_lm, train_bpe_tokenizer
from backends.torch.config import PolicyConfig


@dataclass
class Policy:
    """The policy model (eval mode: no dropout), its tokenizer and the ids rollout needs.

    ``model_path`` is the local folder it was loaded from (None for a preset or a GGUF file:
    a vLLM rollout engine then loads a folder the trainer writes from the model).
    """

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    pad_id: int
    eos_ids: list[int]
    model_path: str | None


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    ids: list[int] = []
    for source in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        for value in source if isinstance(source, list) else [source]:
            if value is not None and value not in ids:
                ids.append(int(value))
    if not ids:
        raise ValueError("policy: neither the tokenizer nor the model defines an EOS token")
    return ids


def build_policy(cfg: PolicyConfig, *, seed: int, device: torch.device) -> Policy:
    """The policy of ``cfg`` on ``device``; preset weights depend on ``preset.seed`` (or ``seed``).

    A preset gets the in-process byte-level BPE of ``adapters.tiny`` (or ``cfg.tokenizer``);
    a GGUF file its own tokenizer (``adapters.gguf.load_gguf``: cached per process, pad and
    eos from the file), unless ``cfg.tokenizer`` names another.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = DTYPES[cfg.dtype]
    if cfg.preset is not None:
        p = cfg.preset
        tokenizer = (
            AutoTokenizer.from_pretrained(cfg.tokenizer)
            if cfg.tokenizer
            else train_bpe_tokenizer(vocab_size=p.vocab_size)
        )
        model = tiny_causal_lm(
            p.family,
            len(tokenizer),
            size=p.size,
            seed=seed if p.seed is None else p.seed,
            dtype=dtype,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        path = None
    elif cfg.gguf is not None:
        model, tokenizer = load_gguf(cfg.gguf, dtype=cfg.dtype)
        if cfg.tokenizer:
            tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizer)
        path = None
    else:
        assert cfg.path is not None  # the config guarantees one source
        path = str(Path(cfg.path).expanduser())
        tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizer or path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    model = model.to(device).eval()  # type: ignore[arg-type]
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    eos = _eos_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    return Policy(model, tokenizer, int(pad), eos, path)


def checkpointed_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The layers of ``model`` with Hugging Face gradient checkpointing enabled."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [
        m
        for m in model.modules()
        if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing
    ]


@contextmanager
def activation_checkpointing(layers: Sequence[torch.nn.Module]) -> Iterator[None]:
    """Make ``layers`` (``checkpointed_layers``) recompute their activations in backward
    for the duration. Hugging Face checkpoints a layer only while that layer is in training
    mode, and the policy stays in eval mode (no dropout, KV cache in ``generate``); this sets
    ``training`` on the layers themselves, not on their children, so dropout stays off."""
    for layer in layers:
        layer.training = True
    try:
        yield
    finally:
        for layer in layers:
            layer.training = False


class PolicyModule(torch.nn.Module):
    """The unit that DDP/FSDP wrap: holds the HF model as ``.module``, forwards to it.

    ``adapters.policy`` sees a wrapper with ``.module`` and calls its ``forward``, so DDP's and
    FSDP's hooks run for every training forward; FSDP shards the decoder layers separately
    and this module as the root (embeddings, final norm, LM head).
    """

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__()
        self.module = model

    def forward(self, **inputs: Any) -> Any:
        return self.module(**inputs)
