"""The direction-model contract and the machinery that takes its gradient.

A ``DirectionModel`` is a frozen differentiable reward model seen in the policy's
vocabulary: it scores a batch of policy rollouts and, on request, returns
g = dR / d(RM input embedding) at every response token, moved to the policy's response
positions (docs/design.md, "DATC's score: work"). ``EmbeddingDirectionModel`` is how all
of the project's reward models do it:

1. Build the RM's input sequences: with the policy's own vocabulary (the fast path,
   detected by ``VocabBridge``) the policy ids are used as they are; with another tokenizer
   the prompt and response are turned into text and re-tokenized by the RM tokenizer
   (``adapters.vocab_bridge``; docs/design.md, "A reward model with another tokenizer").
   Special tokens come from the RM tokenizer's template (``adapters.rm_inputs``).
2. Look the ids up in the RM's embedding table and run one forward pass for the batch from
   ``inputs_embeds``; with ``with_grad``, one backward pass of sum_b R_b w.r.t. the
   embeddings only (``torch.autograd.grad``): the RM's parameters have
   ``requires_grad=False`` and never get a ``.grad``, and the RM stays in eval mode.
3. Move the gradient to policy positions: position by position on the fast path, through
   character offsets otherwise. Prompt and special-token gradients are not used.

The concrete models live in ``adapters.reward_models``.
"""

from __future__ import annotations

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
            E = embedding_for_vocab(self.table, V)
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


def embedding_for_vocab(table: torch.Tensor, vocab: int) -> torch.Tensor:
    """``table`` (V_e, d) with zero rows appended up to ``vocab`` rows (V_e <= vocab).

    Model heads are often wider than the tokenizer (padded vocabularies); the extra ids are
    never text, so they get zero embeddings (no credit signal), like policy tokens that
    decode to nothing.
    """
    rows = table.shape[0]
    if rows > vocab:
        raise CreditError(
            f"reward_embedding: has {rows} rows but the policy's logits have {vocab} entries; "
            "the direction model's embedding must be indexed by the policy vocabulary"
        )
    if rows == vocab:
        return table
    return torch.cat([table, table.new_zeros(vocab - rows, table.shape[1])])


def masked_rows(ids: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
    """Each row's ids where ``mask`` (bool) is set, as lists (one copy to the CPU)."""
    return [row[m].tolist() for row, m in zip(ids.cpu(), mask.cpu(), strict=True)]
