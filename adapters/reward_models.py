"""The concrete direction models: reward models that read ``inputs_embeds``.

- ``SeqClassificationRM``: a one-label ``*ForSequenceClassification`` on prompt + response
  (or the response alone); reward = its logit.
- ``EncoderSimilarityRM``: a sentence encoder, mean-pooled over its attention mask, cosine
  similarity to a target text, on the response only by default.
- ``ModuleRM``: any module mapping (inputs_embeds, attention_mask) -> (B,) with its table.

All three are ``EmbeddingDirectionModel``s (``adapters.direction``): the contract and the
gradient machinery are there; each class here only builds the RM's inputs and reads its
reward. ``adapters.config`` builds them from a config (``REWARD_MODEL_KINDS``).
"""

from __future__ import annotations

from typing import Any

import torch

from adapters.direction import EmbeddingDirectionModel, NonFiniteGrad
from adapters.partitioned import gathered, is_partitioned
from adapters.rm_inputs import PaddingSide, RMInputs, SpecialTemplate
from adapters.signature import accepts_keyword
from credit_core import CreditError
from credit_core.tensor_checks import check_tensor


def _embedding_table(model: torch.nn.Module) -> torch.Tensor:
    """The vectors ``inputs_embeds`` holds for each id (V, d): the input-embedding layer's
    output for every id (for a plain ``nn.Embedding`` its weight itself, or a copy of it
    gathered when ZeRO-3 partitions it)."""
    layer: Any = model.get_input_embeddings()  # type: ignore[operator]
    params = list(layer.parameters())
    zero3 = any(is_partitioned(p) for p in params)
    with gathered(*params), torch.no_grad():
        weight: torch.Tensor = layer.weight
        if type(layer) is torch.nn.Embedding:  # shared, or copied: a gather is freed on exit
            return weight.detach().clone() if zero3 else weight.detach()
        table: torch.Tensor = layer(torch.arange(weight.shape[0], device=weight.device))
    return table.detach()


def _max_length(model: torch.nn.Module, tokenizer: Any, max_length: int | None) -> int:
    config: Any = model.config
    limits = [getattr(config, "max_position_embeddings", None), max_length]
    tok_max = getattr(tokenizer, "model_max_length", None)
    if isinstance(tok_max, int) and tok_max < 1_000_000:
        limits.append(tok_max)
    found = [int(x) for x in limits if isinstance(x, int)]
    return min(found) if found else 1 << 30


def _pad_id(tokenizer: Any) -> int:
    for attr in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, attr, None)
        if isinstance(value, int):
            return value
    return 0


class SeqClassificationRM(EmbeddingDirectionModel):
    """A one-label ``AutoModelForSequenceClassification``: reward = its logit.

    Reads prompt + response as a pair (``include_prompt=True``, the RM tokenizer's pair
    template, e.g. ``[CLS] p [SEP] r [SEP]``) or the response alone. ``padding_side``:
    None picks "right" for encoder families (masked-LM types such as BERT, which pool the
    first token) and "left" otherwise (decoder classifiers pool the last position when
    given ``inputs_embeds``); position ids always count attended tokens. A decoder config
    without ``pad_token_id`` gets the tokenizer's (HF refuses batches otherwise).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        policy_tokenizer: Any | None = None,
        *,
        policy_vocab_size: int | None = None,
        include_prompt: bool = True,
        padding_side: PaddingSide | None = None,
        max_length: int | None = None,
        on_nonfinite_grad: NonFiniteGrad = "error",
    ) -> None:
        config: Any = model.config
        if getattr(config, "num_labels", None) != 1:
            raise CreditError(
                "reward model: expected a single-label classifier (num_labels=1), "
                f"got num_labels={getattr(config, 'num_labels', None)}"
            )
        if padding_side is None:
            from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

            padding_side = (
                "right" if config.model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES else "left"
            )
        if getattr(config, "pad_token_id", None) is None:
            config.pad_token_id = _pad_id(tokenizer)
        self.model = model
        self._kwargs = {
            k for k in ("token_type_ids", "position_ids") if accepts_keyword(model.forward, k)
        }
        super().__init__(
            modules=[model],
            table=_embedding_table(model),
            rm_tokenizer=tokenizer,
            policy_tokenizer=policy_tokenizer,
            template=SpecialTemplate.probe(tokenizer, pair=include_prompt),
            pad_id=_pad_id(tokenizer),
            padding_side=padding_side,
            max_length=_max_length(model, tokenizer, max_length),
            policy_vocab_size=policy_vocab_size,
            on_nonfinite_grad=on_nonfinite_grad,
        )

    def reward_from_embeds(self, inputs_embeds: torch.Tensor, inputs: RMInputs) -> torch.Tensor:
        extra = {k: getattr(inputs, k) for k in self._kwargs}
        logits: torch.Tensor = self.model(
            inputs_embeds=inputs_embeds, attention_mask=inputs.attention_mask, **extra
        ).logits
        if logits.dim() != 2 or logits.shape[1] != 1:
            raise CreditError(
                f"reward model output: expected logits of shape (B, 1), got {tuple(logits.shape)}"
            )
        return logits[:, 0]


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``hidden`` (B, L, d) over attended positions (sentence-transformers' pooling)."""
    m = attention_mask.to(hidden.dtype).unsqueeze(2)
    return (hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)


class EncoderSimilarityRM(EmbeddingDirectionModel):
    """A sentence encoder: reward = cos(mean-pool(encoder(text)), mean-pool(encoder(target))).

    The text is the response alone by default (``include_prompt=False``): the reward
    asks "how close is the response to the target", and a prompt in the pooled text would
    dilute that. ``include_prompt=True`` encodes the pair instead. The pooling is the
    attention-masked mean over all tokens, special tokens included, as sentence-transformers
    does (so the reward equals its cosine similarity).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        policy_tokenizer: Any | None,
        target_text: str,
        *,
        policy_vocab_size: int | None = None,
        include_prompt: bool = False,
        max_length: int | None = None,
        on_nonfinite_grad: NonFiniteGrad = "error",
    ) -> None:
        if not isinstance(target_text, str) or not target_text.strip():
            raise CreditError(f"target_text: expected a non-empty string, got {target_text!r}")
        self.model = model
        self._kwargs = {k for k in ("token_type_ids",) if accepts_keyword(model.forward, k)}
        super().__init__(
            modules=[model],
            table=_embedding_table(model),
            rm_tokenizer=tokenizer,
            policy_tokenizer=policy_tokenizer,
            template=SpecialTemplate.probe(tokenizer, pair=include_prompt),
            pad_id=_pad_id(tokenizer),
            padding_side="right",
            max_length=_max_length(model, tokenizer, max_length),
            policy_vocab_size=policy_vocab_size,
            on_nonfinite_grad=on_nonfinite_grad,
        )
        device = self.table.device
        enc = tokenizer(
            target_text, return_tensors="pt", truncation=True, max_length=self.max_length
        )
        with torch.no_grad():
            out = model(**{k: v.to(device) for k, v in enc.items()})
        self.target = mean_pool(out.last_hidden_state, enc["attention_mask"].to(device))[0]

    def embed(self, inputs_embeds: torch.Tensor, inputs: RMInputs) -> torch.Tensor:
        """Mean-pooled sentence embeddings (B, d_out) of ``inputs_embeds``."""
        extra = {k: getattr(inputs, k) for k in self._kwargs}
        out = self.model(inputs_embeds=inputs_embeds, attention_mask=inputs.attention_mask, **extra)
        return mean_pool(out.last_hidden_state, inputs.attention_mask)

    def reward_from_embeds(self, inputs_embeds: torch.Tensor, inputs: RMInputs) -> torch.Tensor:
        pooled = self.embed(inputs_embeds, inputs)
        return torch.nn.functional.cosine_similarity(
            pooled, self.target.to(pooled.dtype).unsqueeze(0), dim=1
        )


class ModuleRM(EmbeddingDirectionModel):
    """Any ``module(inputs_embeds (B, L, d), attention_mask (B, L)) -> (B,)`` reward.

    ``embedding`` (V, d) is its input table. Without ``tokenizer`` the module reads policy
    token ids (V must be the policy vocabulary size); with its own ``tokenizer`` (and the
    ``policy_tokenizer``) text is bridged like any other RM. The module sees
    [prompt tokens, response tokens] packed and right-padded (``include_prompt=True``), or
    the response tokens alone; no special tokens are added.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        embedding: torch.Tensor,
        *,
        tokenizer: Any | None = None,
        policy_tokenizer: Any | None = None,
        policy_vocab_size: int | None = None,
        include_prompt: bool = True,
        max_length: int | None = None,
        on_nonfinite_grad: NonFiniteGrad = "error",
    ) -> None:
        if not isinstance(module, torch.nn.Module):
            raise CreditError(f"module: expected a torch.nn.Module, got {type(module).__name__}")
        check_tensor("embedding", embedding, (None, None), floating=True)
        if tokenizer is None and policy_vocab_size is None and policy_tokenizer is not None:
            policy_vocab_size = len(policy_tokenizer)  # the module reads policy token ids
        if (
            tokenizer is None
            and policy_vocab_size is not None
            and (embedding.shape[0] != policy_vocab_size)
        ):
            raise CreditError(
                f"embedding: expected {policy_vocab_size} rows (the policy's vocabulary: the "
                f"module reads policy token ids), got shape {tuple(embedding.shape)}"
            )
        self.module = module
        super().__init__(
            modules=[module],
            table=embedding,
            rm_tokenizer=tokenizer,
            policy_tokenizer=policy_tokenizer if tokenizer is not None else None,
            template=SpecialTemplate(pair=include_prompt),
            pad_id=0 if tokenizer is None else _pad_id(tokenizer),
            padding_side="right",
            max_length=max_length or (1 << 30),
            policy_vocab_size=policy_vocab_size,
            on_nonfinite_grad=on_nonfinite_grad,
        )

    def reward_from_embeds(self, inputs_embeds: torch.Tensor, inputs: RMInputs) -> torch.Tensor:
        out = self.module(inputs_embeds, inputs.attention_mask)
        if not isinstance(out, torch.Tensor):
            raise CreditError(
                f"reward model output: expected a tensor of shape (B,), got {type(out).__name__}"
            )
        return out
