"""Reward side: frozen differentiable reward models as ``DirectionModel``s.

A ``DirectionModel`` scores a batch of policy rollouts and, on request, returns
g = dR / d(RM input embedding) at every response token, moved to the policy's response
positions. All of them work the same way (``EmbeddingDirectionModel``):

1. Build the RM's input sequences: with the policy's own vocabulary (the fast path,
   detected by ``VocabBridge``) the policy ids are used as they are; with another tokenizer
   the prompt and response are turned into text and re-tokenized by the RM tokenizer
   (``adapters.vocab_bridge``). Special tokens come from the RM tokenizer's template
   (``adapters.rm_inputs``).
2. Look the ids up in the RM's embedding table and run one forward pass for the batch from
   ``inputs_embeds``; with ``with_grad``, one backward pass of sum_b R_b w.r.t. the
   embeddings only (``torch.autograd.grad``): the RM's parameters have
   ``requires_grad=False`` and never get a ``.grad``, and the RM stays in eval mode.
3. Move the gradient to policy positions: position by position on the fast path, through
   character offsets otherwise. Prompt and special-token gradients are not used.

Implementations: ``SeqClassificationRM`` (a one-label ``*ForSequenceClassification`` on
prompt + response), ``EncoderSimilarityRM`` (a sentence encoder, mean-pooled over its
attention mask, cosine similarity to a target text, on the response only by default), and
``ModuleRM`` (any module mapping (inputs_embeds, attention_mask) -> (B,) with its table).
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from adapters.rm_inputs import PaddingSide, RMInputs, SpecialTemplate, assemble
from adapters.vocab_bridge import VocabBridge, plain_backend
from credit_core import CreditError
from credit_core.tensor_checks import check_tensor

NonFiniteGrad = Literal["error", "pass"]


@dataclass(frozen=True)
class RewardOutput:
    """What ``DirectionModel.score`` returns.

    - rewards (B,) float32 (float64 for a float64 RM): the differentiable RM's reward.
    - reward_grad (B, R, d) float32 (float64 for a float64 RM) or None (not asked for):
      dR_b / d(RM input embedding) moved to policy response positions; exactly 0 at
      response padding, at policy tokens that get no gradient (empty tokens of a bridge,
      tokens truncated away by the RM's max length).
    - diagnostics: counters for logging (``rm/truncated_tokens``,
      ``bridge/dropped_rm_tokens``, ``bridge/dropped_grad_fraction``).
    """

    rewards: torch.Tensor
    reward_grad: torch.Tensor | None = None
    diagnostics: dict[str, float] = field(default_factory=dict)


class DirectionModel(ABC):
    """A frozen differentiable reward model, seen in the policy's vocabulary.

    ``reward_embedding`` (V_policy, d): the RM's input-embedding table E with rows indexed
    by policy token ids (the bridged E' for another tokenizer); pass it to
    ``response_logprobs_and_stats`` for ``PolicyStats``.
    """

    reward_embedding: torch.Tensor

    @property
    def embed_dim(self) -> int:
        """d, the width of the RM's input embeddings."""
        return int(self.reward_embedding.shape[1])

    @abstractmethod
    def score(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        response_ids: torch.Tensor,
        response_mask: torch.Tensor,
        *,
        with_grad: bool,
    ) -> RewardOutput:
        """Rewards (B,) and, if ``with_grad``, the reward gradient (B, R, d).

        prompt_ids/prompt_mask (B, P): the prompt in policy ids, padded on either side;
        response_ids/response_mask (B, R): the response, right-padded (the mask of each row
        is a prefix). One forward (+ one backward) pass for the whole batch.
        """


def check_rollout(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    response_ids: torch.Tensor,
    response_mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate a rollout batch; return (prompt_mask, response_mask) as bool tensors."""
    p = check_tensor("prompt_ids", prompt_ids, (None, None))
    B = p.shape[0]
    for name, t in (("prompt_ids", prompt_ids), ("response_ids", response_ids)):
        if t.is_floating_point() or t.dtype == torch.bool:
            raise CreditError(f"{name}: expected an integer dtype, got {t.dtype}")
    check_tensor("prompt_mask", prompt_mask, tuple(p.shape), device=p.device)
    r = check_tensor("response_ids", response_ids, (B, None), device=p.device)
    check_tensor("response_mask", response_mask, tuple(r.shape), device=p.device)
    rmask = response_mask != 0
    if r.shape[1] > 1 and bool((rmask[:, 1:] & ~rmask[:, :-1]).any()):
        rows = torch.nonzero((rmask[:, 1:] & ~rmask[:, :-1]).any(dim=1)).flatten().tolist()
        raise CreditError(
            f"response_mask: expected right-padded responses (each row a prefix of ones), "
            f"rows {rows} are not"
        )
    return prompt_mask != 0, rmask


def _accepts(module: torch.nn.Module, name: str) -> bool:
    return name in inspect.signature(module.forward).parameters


@dataclass(frozen=True)
class PreparedBatch:
    """RM inputs for a rollout batch plus how to move gradients back to the policy.

    Fast path: ``policy_index`` (B, R) holds the RM position of each policy response token
    (-1: none). Bridged path: ``rm_spans`` (B, K, 2) and ``policy_spans`` (B, R, 2) are the
    character spans of RM and policy response tokens in the same response text.
    """

    inputs: RMInputs
    policy_index: torch.Tensor | None = None
    rm_spans: torch.Tensor | None = None
    policy_spans: torch.Tensor | None = None


class EmbeddingDirectionModel(DirectionModel):
    """Shared machinery of the reward models that read ``inputs_embeds`` (see module doc).

    Subclasses implement ``reward_from_embeds``. Arguments:

    - modules: the RM's modules; put in eval mode, parameters frozen.
    - table (V_rm, d): the vectors that stand for RM token ids (what ``inputs_embeds``
      holds for them).
    - rm_tokenizer / policy_tokenizer: fast tokenizers, or None when the RM reads policy
      ids directly (then ``table`` is indexed by policy ids).
    - policy_vocab_size: rows of ``reward_embedding`` (the policy LM head's size; default
      the policy tokenizer's length, or the table's rows).
    """

    def __init__(
        self,
        *,
        modules: list[torch.nn.Module],
        table: torch.Tensor,
        rm_tokenizer: Any | None,
        policy_tokenizer: Any | None,
        template: SpecialTemplate,
        pad_id: int,
        padding_side: PaddingSide,
        max_length: int,
        policy_vocab_size: int | None = None,
        on_nonfinite_grad: NonFiniteGrad = "error",
    ) -> None:
        if on_nonfinite_grad not in ("error", "pass"):
            raise CreditError(
                f"on_nonfinite_grad: expected 'error' or 'pass', got {on_nonfinite_grad!r}"
            )
        check_tensor("reward model embedding table", table, (None, None), floating=True)
        self.modules = modules
        for module in modules:
            module.eval()
            module.requires_grad_(False)
        self.table = table.detach()
        self.template = template
        self.pad_id = pad_id
        self.padding_side: PaddingSide = padding_side
        self.max_length = max_length
        self.on_nonfinite_grad: NonFiniteGrad = on_nonfinite_grad
        self._rm_backend = None if rm_tokenizer is None else plain_backend(rm_tokenizer)
        self.bridge: VocabBridge | None = None
        if rm_tokenizer is not None and policy_tokenizer is not None:
            self.bridge = VocabBridge.build(
                policy_tokenizer, rm_tokenizer, policy_vocab_size=policy_vocab_size
            )
        if self.bridge is not None:
            V = self.bridge.policy_vocab_size
        elif policy_vocab_size is not None:
            V = policy_vocab_size
        elif policy_tokenizer is not None:
            V = len(policy_tokenizer)
        else:
            V = self.table.shape[0]
        acc = torch.promote_types(self.table.dtype, torch.float32)
        rows = self.table.shape[0]
        if self.bridge is not None:
            E = self.bridge.bridged_embedding(self.table)
        elif rows == V:
            E = self.table
        elif rows < V and rm_tokenizer is not None:
            E = torch.cat([self.table, self.table.new_zeros(V - rows, self.table.shape[1])])
        else:
            raise CreditError(
                f"reward model embedding table: expected {V} rows (the policy's vocabulary), "
                f"got shape {tuple(self.table.shape)}"
            )
        self.reward_embedding = E.to(acc)

    @property
    def identical_vocab(self) -> bool:
        """True when the RM reads the policy's token ids directly (the fast path)."""
        return self.bridge is None or self.bridge.identical

    @property
    def n_empty(self) -> int:
        """Policy tokens with a zero ``reward_embedding`` row that never get gradient."""
        return 0 if self.bridge is None else self.bridge.n_empty

    @abstractmethod
    def reward_from_embeds(self, inputs_embeds: torch.Tensor, inputs: RMInputs) -> torch.Tensor:
        """The RM's reward (B,) for ``inputs_embeds`` (B, L, d) laid out as ``inputs``."""

    def prepare(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        response_ids: torch.Tensor,
        response_mask: torch.Tensor,
    ) -> PreparedBatch:
        """RM inputs for a rollout batch (see ``PreparedBatch``)."""
        pmask, rmask = check_rollout(prompt_ids, prompt_mask, response_ids, response_mask)
        device = self.table.device
        if self.identical_vocab:
            return self._prepare_direct(prompt_ids, pmask, response_ids, rmask, device)
        return self._prepare_bridged(prompt_ids, pmask, response_ids, rmask, device)

    def _prepare_direct(
        self,
        prompt_ids: torch.Tensor,
        pmask: torch.Tensor,
        response_ids: torch.Tensor,
        rmask: torch.Tensor,
        device: torch.device,
    ) -> PreparedBatch:
        checked = [("response_ids", response_ids, rmask)]
        if self.template.pair:
            checked.append(("prompt_ids", prompt_ids, pmask))
        for name, ids, mask in checked:
            real = ids[mask]
            if real.numel() and (int(real.min()) < 0 or int(real.max()) >= len(self.table)):
                raise CreditError(
                    f"{name}: expected ids in [0, {len(self.table)}) (the reward model's "
                    f"vocabulary, shared with the policy), got [{int(real.min())}, "
                    f"{int(real.max())}]"
                )
        prompts = masked_rows(prompt_ids, pmask) if self.template.pair else None
        responses = masked_rows(response_ids, rmask)
        inputs = assemble(
            prompts,
            responses,
            self.template,
            pad_id=self.pad_id,
            padding_side=self.padding_side,
            max_length=self.max_length,
            device=device,
        )
        B, R = response_ids.shape
        K = inputs.response_positions.shape[1]
        index = torch.full((B, R), -1, dtype=torch.long, device=device)
        n = min(K, R)
        index[:, :n] = torch.where(
            inputs.response_valid[:, :n], inputs.response_positions[:, :n], -1
        )
        return PreparedBatch(inputs=inputs, policy_index=index)

    def _prepare_bridged(
        self,
        prompt_ids: torch.Tensor,
        pmask: torch.Tensor,
        response_ids: torch.Tensor,
        rmask: torch.Tensor,
        device: torch.device,
    ) -> PreparedBatch:
        assert self.bridge is not None and self._rm_backend is not None
        backend = self._rm_backend
        spans = self.bridge.spans(response_ids, rmask)
        encoded = backend.encode_batch(spans.texts, add_special_tokens=False)
        responses = [enc.ids for enc in encoded]
        prompts: list[list[int]] | None = None
        if self.template.pair:
            texts = self.bridge.texts(prompt_ids, pmask)
            prompts = [enc.ids for enc in backend.encode_batch(texts, add_special_tokens=False)]
        inputs = assemble(
            prompts,
            responses,
            self.template,
            pad_id=self.pad_id,
            padding_side=self.padding_side,
            max_length=self.max_length,
            device=device,
        )
        B, K = inputs.response_valid.shape
        kept = inputs.response_valid.sum(dim=1).tolist()
        rm_spans = torch.zeros(B, K, 2, dtype=torch.long)
        for b, (enc, n) in enumerate(zip(encoded, kept, strict=True)):
            if n:
                rm_spans[b, :n] = torch.tensor(enc.offsets[:n], dtype=torch.long)
        return PreparedBatch(
            inputs=inputs, rm_spans=rm_spans.to(device), policy_spans=spans.spans.to(device)
        )

    def score(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        response_ids: torch.Tensor,
        response_mask: torch.Tensor,
        *,
        with_grad: bool,
    ) -> RewardOutput:
        """See ``DirectionModel.score``; errors are ``CreditError`` naming the tensor."""
        if any(m.training for module in self.modules for m in module.modules()):
            raise CreditError(
                "reward model: a module is in train mode; a DirectionModel keeps its reward "
                "model in eval mode (call .eval() on it, or do not train it)"
            )
        if with_grad and torch.is_inference_mode_enabled():
            raise CreditError("score(with_grad=True) cannot run under torch.inference_mode()")
        prepared = self.prepare(prompt_ids, prompt_mask, response_ids, response_mask)
        inputs = prepared.inputs
        B = response_ids.shape[0]
        embeds = self.table[inputs.input_ids]
        grad: torch.Tensor | None = None
        if with_grad:
            with torch.enable_grad():
                embeds.requires_grad_(True)
                rewards = self._checked_rewards(embeds, inputs, B)
                (grad,) = torch.autograd.grad(rewards.sum(), embeds, allow_unused=True)
            if grad is None:
                grad = torch.zeros_like(embeds)
        else:
            with torch.no_grad():
                rewards = self._checked_rewards(embeds, inputs, B)
        rewards = rewards.detach()
        bad = ~torch.isfinite(rewards)
        if bool(bad.any()):
            raise CreditError(
                f"rewards: the reward model returned non-finite rewards in rows "
                f"{torch.nonzero(bad).flatten().tolist()}"
            )
        acc = torch.promote_types(rewards.dtype, torch.float32)
        diagnostics = {"rm/truncated_tokens": float(inputs.n_truncated)}
        reward_grad = None
        if grad is not None:
            reward_grad = self._to_policy(grad.to(acc), prepared, diagnostics)
            self._check_grad(reward_grad, response_mask != 0)
            reward_grad = reward_grad.to(response_ids.device)
        return RewardOutput(rewards.to(acc).to(response_ids.device), reward_grad, diagnostics)

    def _checked_rewards(self, embeds: torch.Tensor, inputs: RMInputs, B: int) -> torch.Tensor:
        rewards = self.reward_from_embeds(embeds, inputs)
        if not isinstance(rewards, torch.Tensor) or tuple(rewards.shape) != (B,):
            got = tuple(rewards.shape) if isinstance(rewards, torch.Tensor) else type(rewards)
            raise CreditError(
                f"reward model output: expected shape ({B},) (one reward per response), got {got}"
            )
        return rewards

    def _to_policy(
        self,
        grad: torch.Tensor,
        prepared: PreparedBatch,
        diagnostics: dict[str, float],
    ) -> torch.Tensor:
        d = grad.shape[2]
        if prepared.policy_index is not None:
            index = prepared.policy_index
            picked = grad.gather(1, index.clamp(min=0).unsqueeze(2).expand(*index.shape, d))
            return torch.where((index >= 0).unsqueeze(2), picked, 0.0)
        assert prepared.rm_spans is not None and prepared.policy_spans is not None
        inputs = prepared.inputs
        positions = inputs.response_positions
        g_resp = grad.gather(1, positions.unsqueeze(2).expand(*positions.shape, d))
        g_resp = torch.where(inputs.response_valid.unsqueeze(2), g_resp, 0.0)
        out, dropped = VocabBridge.move_gradients(
            g_resp, prepared.rm_spans, inputs.response_valid, prepared.policy_spans
        )
        mass = g_resp.abs().sum(dim=2)
        total = float(mass.sum())
        diagnostics["bridge/dropped_rm_tokens"] = float(dropped.sum())
        diagnostics["bridge/dropped_grad_fraction"] = (
            float(mass[dropped].sum()) / total if total > 0 else 0.0
        )
        return out

    def _check_grad(self, reward_grad: torch.Tensor, rmask: torch.Tensor) -> None:
        if self.on_nonfinite_grad == "pass":
            return
        bad = (~torch.isfinite(reward_grad)).any(dim=2) & rmask.to(reward_grad.device)
        if bool(bad.any()):
            raise CreditError(
                "reward_grad: non-finite gradient of the reward w.r.t. the RM input embeddings "
                f"in rows {torch.nonzero(bad.any(dim=1)).flatten().tolist()} "
                "(set on_nonfinite_grad='pass' to hand it to the strategy's on_nonfinite)"
            )


def masked_rows(ids: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
    """Each row's ids where ``mask`` (bool) is set, as lists (one copy to the CPU)."""
    return [row[m].tolist() for row, m in zip(ids.cpu(), mask.cpu(), strict=True)]


def _embedding_table(model: torch.nn.Module) -> torch.Tensor:
    """The vectors ``inputs_embeds`` holds for each id: the input-embedding layer's output
    for every id (its weight itself for a plain ``nn.Embedding``)."""
    layer: Any = model.get_input_embeddings()  # type: ignore[operator]
    weight: torch.Tensor = layer.weight
    if type(layer) is torch.nn.Embedding:
        return weight.detach()
    with torch.no_grad():
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
        self._kwargs = {k for k in ("token_type_ids", "position_ids") if _accepts(model, k)}
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
        self._kwargs = {k for k in ("token_type_ids",) if _accepts(model, k)}
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
