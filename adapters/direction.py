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

Two more signals come on request, for the ABC and RED baselines (docs/design.md, "Baselines"):

- ``with_attention``: the RM's last-layer attention (head mean) in the row of the position
  its score is read from, recorded during the same forward (a ``ForwardRecorder`` the
  concrete model supplies), restricted to the response tokens, moved to policy tokens like
  the gradient and renormalized.
- ``with_prefix_rewards``: s_t, the RM score of the prompt with the response's first t
  tokens, and r_t = s_t - s_{t-1}. In general from extra no-grad forwards over all the
  batch's prefixes (``prefix_scores``); for a causal classifier whose score head reads every
  position, from the reward forward itself (a ``ForwardRecorder`` of that head).

Under DeepSpeed ZeRO-3 a reward model's forward is a collective (each layer all-gathers
its partitioned weights, and its backward again): every process must run as many forwards
and backwards. ``EmbeddingDirectionModel.agree_count`` (set by a backend whose direction
model holds ZeRO-3 partitions) makes the passes whose number depends on this process's
rows agree: ``prefix_scores``' chunks (padded with passes whose result is dropped) and the
choice between prefix rewards from the reward forward and from ``prefix_scores``.

The concrete models live in ``adapters.reward_models``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

import torch

from adapters.rm_inputs import PaddingSide, RMInputs, SpecialTemplate, assemble
from adapters.vocab_bridge import VocabBridge, plain_backend
from credit_core import CreditError, TokenRewards
from credit_core.attribution import check_null, reward_attribution
from credit_core.tensor_checks import check_tensor

NonFiniteGrad = Literal["error", "pass"]

#: Agrees on a count over the processes whose direction-model forwards are collectives
#: (ZeRO-3): this process's count in, the largest of any process out. Every process calls
#: it the same number of times (it is a collective itself).
AgreeCount = Callable[[int], int]


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
    - attention (B, R) float32 or None (not asked for): alpha_t >= 0, the RM's last-layer
      attention averaged over heads, in the row of the position its score is read from,
      at policy response position t. Over a row's valid (mask True) response tokens it
      sums to 1; exactly 0 at padding. Prompt and special tokens are left out before
      renormalizing; with the vocabulary bridge each RM token's mass is shared among the
      policy tokens it overlaps (as its gradient is), RM tokens that overlap none lose
      theirs. A row that puts no attention mass on any response token (an empty response,
      response tokens that all vanish through the bridge) is all 0.
    - prefix_rewards (B, R) float32 or None (not asked for): s_{t+1} - s_t at response
      position t < n_b (n_b: the row's valid response length), exactly 0 at padding, where
      s_t is the RM score of the prompt with the response's first t tokens; s_{n_b} is
      ``rewards[b]`` itself, so sum_t prefix_rewards[b, t] = rewards[b] - s_0. s_0 is the
      score with an empty response, and 0 where the RM input would then hold no token at all
      (no prompt, no special tokens: e.g. a ``ModuleRM`` reading the response alone).
    - direction_scores (B,) float32 or None: the direction model's own reward where
      ``rewards`` came from a separate scorer and the direction model ran anyway
      (``adapters.scorers.RewardSignals``); None where it did not run or is the scorer.
    - token_rewards ``credit_core.TokenRewards`` (B, R) or None: the rewards per token or per
      step that a reward function returned (``adapters.scorers.CallableScorer``); None where
      it returned one number per response.
    """

    rewards: torch.Tensor
    reward_grad: torch.Tensor | None = None
    diagnostics: dict[str, float] = field(default_factory=dict)
    attention: torch.Tensor | None = None
    prefix_rewards: torch.Tensor | None = None
    direction_scores: torch.Tensor | None = None
    token_rewards: TokenRewards | None = None


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

    def null_embedding(self, kind: str) -> torch.Tensor:
        """e_null (d,), in ``reward_embedding``'s dtype and on its device, for the
        ``reward_attribution`` signal (``credit_core.attribution``): ``zero`` here; ``pad``
        and ``unk`` from a model with a token table (``EmbeddingDirectionModel``).
        ``CreditError`` naming ``null`` and saying why a kind is unavailable."""
        check_null(kind)
        if kind != "zero":
            raise CreditError(
                f"null: {kind!r} needs the reward model's token embeddings, but "
                f"{type(self).__name__} has no token table; use null: zero"
            )
        return self.reward_embedding.new_zeros(self.embed_dim)

    def attribution(
        self,
        reward_grad: torch.Tensor,
        response_ids: torch.Tensor,
        response_mask: torch.Tensor,
        kind: str,
    ) -> torch.Tensor:
        """``reward_attribution`` (B, R) from this model's ``reward_grad`` (B, R, d) at the
        policy response tokens ``response_ids`` (B, R) under ``response_mask`` (B, R): r_t =
        (E'[y_t] - e_null) . g_t with E' = ``reward_embedding`` and e_null =
        ``null_embedding(kind)``; 0 at padding; float32 (float64 for a float64 RM)."""
        E = self.reward_embedding
        dev = reward_grad.device
        return reward_attribution(
            reward_grad,
            response_ids.to(dev),
            response_mask.to(dev).bool(),
            E.to(dev),
            self.null_embedding(kind).to(dev),
        )

    @property
    def gives_attention(self) -> bool:
        """Whether ``score(..., with_attention=True)`` can give ``attention`` (False here: a
        model that can says so), known without scoring: a backend refuses an attention
        strategy (ABC) at start-up with it."""
        return False

    @abstractmethod
    def score(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        response_ids: torch.Tensor,
        response_mask: torch.Tensor,
        *,
        with_grad: bool,
        with_attention: bool = False,
        with_prefix_rewards: bool = False,
    ) -> RewardOutput:
        """Rewards (B,) and, if asked, the reward gradient (B, R, d), the attention (B, R)
        and the prefix rewards (B, R) (see ``RewardOutput``).

        prompt_ids/prompt_mask (B, P): the prompt in policy ids, padded on either side;
        response_ids/response_mask (B, R): the response, right-padded (the mask of each row
        is a prefix). One forward (+ one backward) pass for the whole batch gives the
        rewards, the gradient and the attention; prefix rewards may take more passes.
        ``with_attention`` raises ``CreditError`` where ``gives_attention`` is False.
        """


def score_rollout(
    model: DirectionModel,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    response_ids: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    with_grad: bool,
    with_attention: bool = False,
    with_prefix_rewards: bool = False,
) -> RewardOutput:
    """``model.score`` with only the signals asked for, each checked to be there.

    ``with_attention`` / ``with_prefix_rewards`` are passed only when set, so a
    ``DirectionModel`` whose ``score`` predates them (a user's ``kind: module`` factory)
    still serves every strategy that does not read them. Raises ``CreditError`` when
    attention is asked of a model whose ``gives_attention`` is False, or when an asked-for
    output is missing or not (B, R).
    """
    if with_attention and not model.gives_attention:
        raise CreditError(
            f"attention: {type(model).__name__} gives no attention weights (gives_attention is "
            "False); ABC needs a transformer reward model with attentions"
        )
    flags = {"with_attention": True} if with_attention else {}
    if with_prefix_rewards:
        flags["with_prefix_rewards"] = True
    out = model.score(
        prompt_ids, prompt_mask, response_ids, response_mask, with_grad=with_grad, **flags
    )
    for wanted, name, value in (
        (with_attention, "attention", out.attention),
        (with_prefix_rewards, "prefix_rewards", out.prefix_rewards),
    ):
        if not wanted:
            continue
        if value is None:
            raise CreditError(f"{name}: asked of {type(model).__name__}.score, which returned none")
        check_tensor(name, value, tuple(response_ids.shape), floating=True)
    return out


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


@dataclass
class Recorded:
    """A tensor a forward hook records during one reward forward (None until it runs)."""

    value: torch.Tensor | None = None


class ForwardRecorder(Protocol):
    """Records one tensor during the reward forward that runs inside ``record(inputs)``.

    ``record`` is a context manager yielding the ``Recorded`` it fills; ``inputs`` are the
    RM inputs of that forward. Its ``value`` is detached (B, L) over RM positions.
    """

    def record(self, inputs: RMInputs) -> AbstractContextManager[Recorded]: ...


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
    - prefix_batch_rows: rows (prompt + response prefix) per no-grad forward of
      ``prefix_scores``; lower it when those forwards run out of memory.

    Subclasses that can record more during the reward forward set, after this constructor:
    ``attention_recorder`` (the pooled position's last-layer attention, (B, L) over RM
    positions, head mean: then ``gives_attention`` is True; otherwise ``no_attention`` says
    why not) and ``position_scores_recorder`` (the score at every RM position of a causal
    classifier, (B, L): prefix rewards from the reward forward itself when nothing is
    truncated; the subclass sets it only where that equals ``prefix_scores``).

    ``agree_count`` (None: this process decides alone) is set by a backend whose reward
    model's forward is a collective (ZeRO-3 partitions, ``adapters.partitioned``): the
    processes then agree on every number of forwards that depends on their own rows (see
    the module docstring).
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
        prefix_batch_rows: int = 64,
    ) -> None:
        if on_nonfinite_grad not in ("error", "pass"):
            raise CreditError(
                f"on_nonfinite_grad: expected 'error' or 'pass', got {on_nonfinite_grad!r}"
            )
        if (
            isinstance(prefix_batch_rows, bool)
            or not isinstance(prefix_batch_rows, int)
            or prefix_batch_rows < 1
        ):
            raise CreditError(f"prefix_batch_rows: expected an int >= 1, got {prefix_batch_rows!r}")
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
        self.prefix_batch_rows = prefix_batch_rows
        self.attention_recorder: ForwardRecorder | None = None
        self.no_attention = f"{type(self).__name__} records no attention weights"
        self.position_scores_recorder: ForwardRecorder | None = None
        self.agree_count: AgreeCount | None = None
        unk = getattr(rm_tokenizer, "unk_token_id", None)
        self.unk_id: int | None = unk if isinstance(unk, int) else None
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

    def null_embedding(self, kind: str) -> torch.Tensor:
        """e_null (d,): ``pad``, the table row of ``pad_id`` (the id the RM pads its inputs
        with: its tokenizer's pad token, else its eos token; 0 for a ``ModuleRM`` reading
        policy ids); ``unk``, the row of the RM tokenizer's unknown token (``CreditError``
        when it has none); ``zero``, the zero vector."""
        check_null(kind)
        if kind == "zero":
            return super().null_embedding(kind)
        token = self.pad_id if kind == "pad" else self.unk_id
        if token is None:
            raise CreditError(
                "null: 'unk' needs the reward model tokenizer's unknown token, but "
                f"{type(self).__name__} has none (no tokenizer, or unk_token_id is None); "
                "use null: pad or zero"
            )
        acc = self.reward_embedding.dtype
        return self.table[token].to(device=self.reward_embedding.device, dtype=acc)

    @property
    def gives_attention(self) -> bool:
        """True when an ``attention_recorder`` is set (see the class docstring)."""
        return self.attention_recorder is not None

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
        with_attention: bool = False,
        with_prefix_rewards: bool = False,
    ) -> RewardOutput:
        """See ``DirectionModel.score``; errors are ``CreditError`` naming the tensor.

        One forward (+ one backward with ``with_grad``) gives the rewards, the gradient and
        the attention. Prefix rewards come from that same forward where a
        ``position_scores_recorder`` is set and no RM input reached ``max_length``;
        otherwise from ``prefix_scores``'s extra no-grad forwards (cost there).
        """
        if any(m.training for module in self.modules for m in module.modules()):
            raise CreditError(
                "reward model: a module is in train mode; a DirectionModel keeps its reward "
                "model in eval mode (call .eval() on it, or do not train it)"
            )
        if with_grad and torch.is_inference_mode_enabled():
            raise CreditError("score(with_grad=True) cannot run under torch.inference_mode()")
        attention_recorder = self.attention_recorder
        if with_attention and attention_recorder is None:
            raise CreditError(
                f"attention: {self.no_attention}; ABC needs a transformer reward model with "
                "attentions"
            )
        prepared = self.prepare(prompt_ids, prompt_mask, response_ids, response_mask)
        inputs = prepared.inputs
        B, R = response_ids.shape
        position_recorder = self.position_scores_recorder if with_prefix_rewards else None
        if position_recorder is not None:
            truncated = int(bool((inputs.attention_mask.sum(dim=1) >= self.max_length).any()))
            if self.agree_count is not None:  # prefix_scores' passes on every process, or none
                truncated = self.agree_count(truncated)
            if truncated:
                position_recorder = None  # a row may be truncated: its prefixes are not its cuts
        embeds = self.table[inputs.input_ids]
        attention: Recorded | None = None
        positions: Recorded | None = None
        with ExitStack() as recording:
            if with_attention and attention_recorder is not None:
                attention = recording.enter_context(attention_recorder.record(inputs))
            if position_recorder is not None:
                positions = recording.enter_context(position_recorder.record(inputs))
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
        rewards = self._checked_finite("rewards", rewards.detach())
        acc = torch.promote_types(rewards.dtype, torch.float32)
        diagnostics = {"rm/truncated_tokens": float(inputs.n_truncated)}
        rmask = response_mask != 0
        out = RewardOutput(rewards.to(acc).to(response_ids.device), None, diagnostics)
        if grad is not None:
            reward_grad = self._grad_to_policy(grad.to(acc), prepared, diagnostics)
            self._check_grad(reward_grad, rmask)
            out = replace(out, reward_grad=reward_grad.to(response_ids.device))
        if attention is not None:
            alpha = self._attention_to_policy(_recorded(attention, "attention"), prepared)
            out = replace(out, attention=_renormalized(alpha.to(response_ids.device), rmask))
        if with_prefix_rewards:
            if positions is not None:
                recorded = _recorded(positions, "position scores")
                scores = self._scores_at_cuts(recorded, inputs, R).to(response_ids.device)
            else:
                scores = self.prefix_scores(prompt_ids, prompt_mask, response_ids, response_mask)
            out = replace(out, prefix_rewards=_telescoped(scores, out.rewards, rmask))
        return out

    def prefix_scores(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        response_ids: torch.Tensor,
        response_mask: torch.Tensor,
    ) -> torch.Tensor:
        """s (B, R), accumulation dtype, on the response's device: s[b, t] is the RM score
        of row b's prompt with the first t response tokens, for t < n_b (0 elsewhere).

        The general path of prefix rewards (the full response, t = n_b, is the ordinary
        reward). Each cut response goes through ``prepare`` like any response, so the
        template's special tokens follow the cut (BERT's final [SEP]) and, through the
        bridge, the cut policy tokens' text is re-tokenized. s_0 is the score with an empty
        response; where the RM input would then hold no token at all (no prompt and no
        special tokens), s_0 = 0 without a forward.

        Cost: sum_b n_b rows (at most B * R: R forwards' worth of rows) in no-grad forwards
        of ``prefix_batch_rows`` rows each, rows of similar t together; no backward. A
        Python loop runs over those chunks only. With ``agree_count``, every process runs the
        largest number of chunks of any process, a chunk of its own with nothing to score
        replaced by a one-row forward whose result is dropped (``_dropped_pass``).
        """
        _, rmask = check_rollout(prompt_ids, prompt_mask, response_ids, response_mask)
        B, R = response_ids.shape
        device = response_ids.device
        acc = torch.promote_types(self.table.dtype, torch.float32)
        scores = torch.zeros(B, R, dtype=acc, device=device)
        columns = torch.arange(R, device=device)
        rows, cuts = torch.nonzero(columns < rmask.sum(dim=1, keepdim=True), as_tuple=True)
        order = torch.argsort(cuts, stable=True)
        rows, cuts = rows[order], cuts[order]
        size = self.prefix_batch_rows
        passes = -(-int(rows.numel()) // size)
        if self.agree_count is not None:
            passes = self.agree_count(passes)
        rollout = (prompt_ids, prompt_mask, response_ids, response_mask)
        for start in range(0, passes * size, size):
            b, t = rows[start : start + size], cuts[start : start + size]
            if b.numel() == 0:  # the other processes still have prefixes to score
                self._dropped_pass(*rollout)
                continue
            inputs = self.prepare(
                prompt_ids[b], prompt_mask[b], response_ids[b], columns < t.unsqueeze(1)
            ).inputs
            filled = (inputs.attention_mask != 0).any(dim=1)
            if not bool(filled.any()):
                if self.agree_count is not None:
                    self._dropped_pass(*rollout)
                continue
            if not bool(filled.all()):
                inputs = _rows_of(inputs, filled)
            with torch.no_grad():
                values = self._checked_rewards(
                    self.table[inputs.input_ids], inputs, inputs.input_ids.shape[0]
                )
            values = self._checked_finite("prefix scores", values)
            keep = filled.to(device)
            scores[b[keep], t[keep]] = values.to(device, acc)
        return scores

    def _dropped_pass(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        response_ids: torch.Tensor,
        response_mask: torch.Tensor,
    ) -> None:
        """One no-grad forward of the rollout's first row, its result dropped: this
        process's share of a collective forward the other processes run (``agree_count``)."""
        if response_ids.shape[0] == 0:
            raise CreditError(
                "reward model: a process without rows cannot take part in the other "
                "processes' forwards of a ZeRO-3 partitioned reward model"
            )
        inputs = self.prepare(
            prompt_ids[:1], prompt_mask[:1], response_ids[:1], response_mask[:1]
        ).inputs
        with torch.no_grad():
            self.reward_from_embeds(self.table[inputs.input_ids], inputs)

    def _checked_rewards(self, embeds: torch.Tensor, inputs: RMInputs, B: int) -> torch.Tensor:
        rewards = self.reward_from_embeds(embeds, inputs)
        if not isinstance(rewards, torch.Tensor) or tuple(rewards.shape) != (B,):
            got = tuple(rewards.shape) if isinstance(rewards, torch.Tensor) else type(rewards)
            raise CreditError(
                f"reward model output: expected shape ({B},) (one reward per response), got {got}"
            )
        return rewards

    @staticmethod
    def _checked_finite(name: str, rewards: torch.Tensor) -> torch.Tensor:
        bad = ~torch.isfinite(rewards)
        if bool(bad.any()):
            raise CreditError(
                f"{name}: the reward model returned non-finite rewards in rows "
                f"{torch.nonzero(bad).flatten().tolist()}"
            )
        return rewards

    def _to_policy(
        self, values: torch.Tensor, prepared: PreparedBatch
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """``values`` (B, L, d) at RM positions -> (B, R, d) at policy response positions
        (0 where none), plus, through the bridge, the RM response tokens' values (B, K, d)
        and which of them were dropped (B, K) (None on the fast path)."""
        d = values.shape[2]
        if prepared.policy_index is not None:
            index = prepared.policy_index
            picked = values.gather(1, index.clamp(min=0).unsqueeze(2).expand(*index.shape, d))
            return torch.where((index >= 0).unsqueeze(2), picked, 0.0), None, None
        assert prepared.rm_spans is not None and prepared.policy_spans is not None
        inputs = prepared.inputs
        positions = inputs.response_positions
        v_resp = values.gather(1, positions.unsqueeze(2).expand(*positions.shape, d))
        v_resp = torch.where(inputs.response_valid.unsqueeze(2), v_resp, 0.0)
        out, dropped = VocabBridge.move_gradients(
            v_resp, prepared.rm_spans, inputs.response_valid, prepared.policy_spans
        )
        return out, v_resp, dropped

    def _grad_to_policy(
        self,
        grad: torch.Tensor,
        prepared: PreparedBatch,
        diagnostics: dict[str, float],
    ) -> torch.Tensor:
        out, g_resp, dropped = self._to_policy(grad, prepared)
        if g_resp is not None and dropped is not None:
            mass = g_resp.abs().sum(dim=2)
            total = float(mass.sum())
            diagnostics["bridge/dropped_rm_tokens"] = float(dropped.sum())
            diagnostics["bridge/dropped_grad_fraction"] = (
                float(mass[dropped].sum()) / total if total > 0 else 0.0
            )
        return out

    def _attention_to_policy(self, row: torch.Tensor, prepared: PreparedBatch) -> torch.Tensor:
        """The pooled attention row (B, L) over RM positions -> its mass on each policy
        response token (B, R), not normalized: response tokens only (prompt and special
        tokens are left out), RM-token mass shared by the bridge's character overlap."""
        acc = torch.promote_types(row.dtype, torch.float32)
        moved, _, _ = self._to_policy(row.to(acc).unsqueeze(2), prepared)
        return moved[..., 0]

    @staticmethod
    def _scores_at_cuts(position_scores: torch.Tensor, inputs: RMInputs, R: int) -> torch.Tensor:
        """s (B, R) as ``prefix_scores`` gives it, read off a causal classifier's score at
        every RM position (B, L) in the reward forward (fast path, left padding, no suffix,
        nothing truncated): s_t at the position of response token t - 1, s_0 at the one
        before the response (0 where that is padding or there is none)."""
        positions = inputs.response_positions
        K = positions.shape[1]
        before = positions[:, :1] - 1
        at = torch.cat([before, positions[:, : K - 1]], dim=1)
        acc = torch.promote_types(position_scores.dtype, torch.float32)
        s = position_scores.to(acc).gather(1, at.clamp(min=0))
        attended = inputs.attention_mask.gather(1, before.clamp(min=0)) != 0
        s[:, :1] = torch.where((before >= 0) & attended, s[:, :1], 0.0)
        s = torch.where(inputs.response_valid, s, 0.0)
        return torch.nn.functional.pad(s, (0, max(R - K, 0)))[:, :R]

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


def _recorded(record: Recorded, name: str) -> torch.Tensor:
    if record.value is None:
        raise CreditError(
            f"{name}: the reward model's forward never ran the module they are recorded from"
        )
    return record.value


def _renormalized(mass: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``mass`` (B, R) >= 0 zeroed outside ``mask`` and scaled to sum to 1 per row, float32;
    a row without mass stays all 0."""
    mass = torch.where(mask, mass, 0.0)
    total = mass.sum(dim=1, keepdim=True)
    return torch.where(total > 0, mass / torch.where(total > 0, total, 1.0), 0.0).float()


def _telescoped(scores: torch.Tensor, rewards: torch.Tensor, rmask: torch.Tensor) -> torch.Tensor:
    """Prefix rewards (B, R) float32: s_{t+1} - s_t for t < n_b, 0 elsewhere, from
    ``scores`` s_t (B, R) (t < n_b) and s_{n_b} = ``rewards`` (B,)."""
    n = rmask.sum(dim=1, keepdim=True)
    t = torch.arange(scores.shape[1], device=scores.device).unsqueeze(0)
    following = torch.where(
        t == n - 1, rewards.to(scores.dtype).unsqueeze(1), scores.roll(-1, dims=1)
    )
    return torch.where(t < n, following - scores, 0.0).float()


def _rows_of(inputs: RMInputs, rows: torch.Tensor) -> RMInputs:
    """The rows ``rows`` (bool (B,)) of ``inputs``."""
    return RMInputs(
        input_ids=inputs.input_ids[rows],
        attention_mask=inputs.attention_mask[rows],
        token_type_ids=inputs.token_type_ids[rows],
        position_ids=inputs.position_ids[rows],
        response_positions=inputs.response_positions[rows],
        response_valid=inputs.response_valid[rows],
        n_truncated=inputs.n_truncated,
    )
