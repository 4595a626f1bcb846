"""The concrete direction models: reward models that read ``inputs_embeds``.

- ``SeqClassificationRM``: a one-label ``*ForSequenceClassification`` on prompt + response
  (or the response alone); reward = its logit.
- ``EncoderSimilarityRM``: a sentence encoder, mean-pooled over its attention mask, cosine
  similarity to a target text, on the response only by default.
- ``ModuleRM``: any module mapping (inputs_embeds, attention_mask) -> (B,) with its table.

All three are ``EmbeddingDirectionModel``s (``adapters.direction``): the contract and the
gradient machinery are there; each class here only builds the RM's inputs and reads its
reward. ``adapters.config`` builds them from a config (``REWARD_MODEL_KINDS``).

The two transformers kinds also record, on request, their last-layer attention in the row
of the position their score is read from (``LastLayerAttention``; ABC), and a causal
classifier its score at every position (``ScoreHeadOutputs``; RED's prefix rewards from one
forward). ``ModuleRM`` has no attention.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Literal

import torch

from adapters.direction import EmbeddingDirectionModel, NonFiniteGrad, Recorded
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


AttentionPooling = Literal["first", "last", "mean"]

#: Encoder families whose ``*ForSequenceClassification`` reads the first token's last hidden
#: state (transformers 5 source: BERT-style ``pooler`` on token 0, RoBERTa-style heads on
#: ``features[:, 0, :]``, DistilBERT ``hidden_state[:, 0]``, DeBERTa's ``ContextPooler``;
#: some record no attention weights, see ``last_attention_module``). ModernBERT and EuroBERT
#: pool as their config's ``classifier_pooling`` says; other encoder families (BART's EOS
#: token, Funnel, XLM's sequence summary, ...) are not listed: no attention is read there.
FIRST_TOKEN_CLASSIFIERS = frozenset(
    {
        "albert",
        "bert",
        "camembert",
        "convbert",
        "data2vec-text",
        "deberta",
        "deberta-v2",
        "distilbert",
        "electra",
        "ernie",
        "esm",
        "layoutlm",
        "megatron-bert",
        "mobilebert",
        "mpnet",
        "nomic_bert",
        "roberta",
        "roberta-prelayernorm",
        "roc_bert",
        "xlm-roberta",
        "xlm-roberta-xl",
        "xmod",
    }
)


def classifier_pooling(config: Any) -> AttentionPooling | None:
    """The position a one-label ``*ForSequenceClassification`` of ``config`` reads its score
    from, as ``LastLayerAttention`` pools it (None: not known).

    Encoder families (masked-LM model types, right-padded here): "first" for
    ``FIRST_TOKEN_CLASSIFIERS``, ModernBERT ``classifier_pooling="cls"`` and EuroBERT
    ``"bos"``; "mean" for their mean pooling (and EuroBERT's ``"late"``, the mean of
    per-position scores). Decoder classifiers (left-padded here, read from
    ``inputs_embeds``) pool the last position: "last". Encoder-decoder models: None.
    """
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    kind = config.model_type
    if getattr(config, "is_encoder_decoder", False):
        return None
    if kind not in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return "last"
    if kind in FIRST_TOKEN_CLASSIFIERS:
        return "first"
    if kind in ("modernbert", "eurobert"):
        pooling = getattr(config, "classifier_pooling", None)
        if pooling in ("cls", "bos"):
            return "first"
        if pooling in ("mean", "late"):
            return "mean"
    return None


def last_attention_module(model: torch.nn.Module) -> tuple[torch.nn.Module, int] | None:
    """The last module transformers records self-attention weights from, and the index of
    the weights in its output tuple; None when the model declares none
    (``_can_record_outputs["attentions"]``: a class, a class-name suffix or an
    ``OutputRecorder``) or cannot switch its attention implementation."""
    declared = getattr(model, "_can_record_outputs", None) or {}
    specs = declared.get("attentions")
    if specs is None or not callable(getattr(model, "set_attn_implementation", None)):
        return None
    found: tuple[torch.nn.Module, int] | None = None
    for spec in specs if isinstance(specs, list) else [specs]:
        if isinstance(spec, type):
            target, suffix, layer, index = spec, None, None, 1
        elif isinstance(spec, str):
            target, suffix, layer, index = None, spec, None, 1
        else:
            target, suffix = spec.target_class, spec.class_name
            layer, index = spec.layer_name, spec.index
        for name, module in model.named_modules():
            if not (
                (target is not None and isinstance(module, target))
                or (suffix is not None and name.endswith(suffix))
            ):
                continue
            if layer is not None and f".{layer.strip('.')}." not in f".{name}.":
                continue
            found = (module, index)
    return found


@contextmanager
def _recording(module: torch.nn.Module, read: Callable[[Any], torch.Tensor]) -> Iterator[Recorded]:
    """A forward hook on ``module`` that records ``read(output)``, detached, while open."""
    recorded = Recorded()

    def hook(_module: torch.nn.Module, _args: Any, output: Any) -> None:
        recorded.value = read(output).detach()

    handle = module.register_forward_hook(hook)
    try:
        yield recorded
    finally:
        handle.remove()


def pooled_attention(
    weights: torch.Tensor, attention_mask: torch.Tensor, pooling: AttentionPooling
) -> torch.Tensor:
    """The head mean of attention ``weights`` (B, H, L, L) in the pooled row (B, L):
    query 0 ("first"), query L - 1 ("last") or the mean over the attended queries of
    ``attention_mask`` (B, L) ("mean")."""
    if pooling == "first":
        return weights[:, :, 0, :].mean(dim=1)
    if pooling == "last":
        return weights[:, :, -1, :].mean(dim=1)
    m = attention_mask.to(weights.dtype)
    total = weights.shape[1] * m.sum(dim=1, keepdim=True).clamp(min=1.0)
    return torch.einsum("bhqk,bq->bk", weights, m) / total


_FLOAT64_EAGER = (
    "; the eager attention of most decoders (Llama, Qwen2, ...) takes its softmax in float32, "
    "where a float64 padding mask's minimum becomes -inf and a padded row NaN: run the reward "
    "model in float32 or bfloat16 for ABC"
)


class LastLayerAttention:
    """A ``ForwardRecorder``: a transformers model's last-layer attention, head mean, in
    the row of the position its output is pooled from (``pooled_attention``), (B, L).

    How: SDPA and flash attention compute no weights (in transformers 5,
    ``output_attentions=True`` under SDPA warns and records nothing), so inside ``record``
    the model runs eager attention (``set_attn_implementation("eager")``, switched back to
    what it was on exit; nothing changes for other calls). A forward hook on the last
    module transformers itself records attentions from (``last_attention_module``, e.g. the
    last ``BertSelfAttention`` or ``LlamaAttention``) reduces the weights (B, H, L, L) it
    returns to the pooled row at once. ``output_attentions`` is not used, so no other
    layer's weights are kept (eager still computes each layer's in turn, and a
    ``with_grad`` pass keeps them for the backward as any eager forward does).

    ``pooling`` "mean" is our reading of "the pooled position" of a mean-pooled encoder: its
    pooled vector is the mean of the attended positions' last hidden states, so its
    attention row is the mean of their attention rows.

    Non-finite weights in the pooled row raise ``CreditError`` during the forward: a
    float64 decoder's eager attention (softmax in float32) turns a left-padded row to NaN.
    """

    def __init__(
        self, model: torch.nn.Module, module: torch.nn.Module, index: int, pooling: AttentionPooling
    ) -> None:
        self.model = model
        self.module = module
        self.index = index
        self.pooling: AttentionPooling = pooling

    @contextmanager
    def record(self, inputs: RMInputs) -> Iterator[Recorded]:
        """Record during the forward run inside (see the class docstring)."""
        model: Any = self.model
        before = model.config._attn_implementation
        mask = inputs.attention_mask

        def read(output: Any) -> torch.Tensor:
            weights = output[self.index] if isinstance(output, tuple) else None
            if not isinstance(weights, torch.Tensor) or weights.dim() != 4:
                raise CreditError(
                    f"attention: {type(self.module).__name__} returned no attention weights "
                    f"(B, H, L, L) under {model.config._attn_implementation!r} attention"
                )
            row = pooled_attention(weights.detach(), mask, self.pooling)
            bad = ~torch.isfinite(row).all(dim=1)
            if bool(bad.any()):
                raise CreditError(
                    "attention: non-finite last-layer attention weights in rows "
                    f"{torch.nonzero(bad).flatten().tolist()} under eager attention "
                    f"({weights.dtype}){_FLOAT64_EAGER if weights.dtype == torch.float64 else ''}"
                )
            return row

        if before != "eager":
            model.set_attn_implementation("eager")
        try:
            with _recording(self.module, read) as recorded:
                yield recorded
        finally:
            if before != "eager":
                model.set_attn_implementation(before)


class ScoreHeadOutputs:
    """A ``ForwardRecorder``: a causal classifier's score head at every position (B, L).

    HF decoder classifiers (``LlamaForSequenceClassification`` and the others built on
    ``GenericForSequenceClassification``, GPT-2's, ...) apply ``model.score`` to every
    position's last hidden state and then keep the last one; a forward hook on that head
    keeps them all. Under causal attention position i's score is the score of the sequence
    cut after i.
    """

    def __init__(self, head: torch.nn.Module) -> None:
        self.head = head

    def record(self, inputs: RMInputs) -> AbstractContextManager[Recorded]:
        """Record during the forward run inside; ``inputs`` are not needed."""
        return _recording(self.head, self._read)

    def _read(self, output: Any) -> torch.Tensor:
        if not isinstance(output, torch.Tensor) or output.dim() != 3 or output.shape[2] != 1:
            got = tuple(output.shape) if isinstance(output, torch.Tensor) else type(output)
            raise CreditError(
                f"position scores: expected the score head's output (B, L, 1), got {got}"
            )
        return output[..., 0]


def _read_attention(
    dm: EmbeddingDirectionModel, model: torch.nn.Module, pooling: AttentionPooling | None
) -> None:
    """Give ``dm`` the recorder of ``model``'s pooled attention, or say why there is none."""
    config: Any = getattr(model, "config", None)
    found = last_attention_module(model)
    if pooling is None:
        dm.no_attention = (
            f"the classifier of model_type {getattr(config, 'model_type', None)!r} pools no "
            "position we know (ABC reads that position's attention row)"
        )
    elif found is None:
        dm.no_attention = (
            f"{type(model).__name__} declares no attention module transformers records "
            "weights from (_can_record_outputs['attentions']) or cannot switch to eager "
            "attention (set_attn_implementation)"
        )
    else:
        dm.attention_recorder = LastLayerAttention(model, found[0], found[1], pooling)


class SeqClassificationRM(EmbeddingDirectionModel):
    """A one-label ``AutoModelForSequenceClassification``: reward = its logit.

    Reads prompt + response as a pair (``include_prompt=True``, the RM tokenizer's pair
    template, e.g. ``[CLS] p [SEP] r [SEP]``) or the response alone. ``padding_side``:
    None picks "right" for encoder families (masked-LM types such as BERT, which pool the
    first token) and "left" otherwise (decoder classifiers pool the last position when
    given ``inputs_embeds``); position ids always count attended tokens. A decoder config
    without ``pad_token_id`` gets the tokenizer's (HF refuses batches otherwise).

    Attention (``with_attention``): the row of the position the classifier pools
    (``classifier_pooling``: [CLS], position 0, for encoder families; the last position,
    the last non-pad token under left padding, for decoders), recorded by
    ``LastLayerAttention`` in the reward forward. Prefix rewards: a decoder classifier with a
    ``score`` head, left padding, the policy's own vocabulary and no special token after
    the response (no template suffix) reads every prefix's score off that one forward
    (``ScoreHeadOutputs``; no extra cost), unless a row reaches ``max_length``; otherwise
    ``prefix_scores``' extra no-grad forwards (sum_b n_b rows, R forwards' worth at most).
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
        prefix_batch_rows: int = 64,
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
            prefix_batch_rows=prefix_batch_rows,
        )
        pooling = classifier_pooling(config)
        _read_attention(self, model, pooling)
        head = getattr(model, "score", None)
        if (
            pooling == "last"
            and isinstance(head, torch.nn.Module)
            and not self.template.suffix
            and self.padding_side == "left"
            and self.identical_vocab
        ):
            self.position_scores_recorder = ScoreHeadOutputs(head)

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

    Attention (``with_attention``): the mean of the last layer's head-mean attention rows
    over the attended positions (``LastLayerAttention`` with "mean" pooling: our reading of
    "the pooled position" of a mean-pooled encoder), recorded in the reward forward.
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
        prefix_batch_rows: int = 64,
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
            prefix_batch_rows=prefix_batch_rows,
        )
        device = self.table.device
        enc = tokenizer(
            target_text, return_tensors="pt", truncation=True, max_length=self.max_length
        )
        with torch.no_grad():
            out = model(**{k: v.to(device) for k, v in enc.items()})
        self.target = mean_pool(out.last_hidden_state, enc["attention_mask"].to(device))[0]
        _read_attention(self, model, "mean")

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

    It has no attention weights: ``with_attention`` raises ``CreditError``
    (``gives_attention`` is False). Prefix rewards take ``prefix_scores``' extra forwards;
    reading the response alone (``include_prompt=False``), its s_0 is 0: an empty input is
    not scored.
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
        prefix_batch_rows: int = 64,
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
            prefix_batch_rows=prefix_batch_rows,
        )
        self.no_attention = "a module reward model (ModuleRM) has no attention weights to read"

    def reward_from_embeds(self, inputs_embeds: torch.Tensor, inputs: RMInputs) -> torch.Tensor:
        out = self.module(inputs_embeds, inputs.attention_mask)
        if not isinstance(out, torch.Tensor):
            raise CreditError(
                f"reward model output: expected a tensor of shape (B,), got {type(out).__name__}"
            )
        return out
