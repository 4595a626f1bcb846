"""Code that runs inside OpenRLHF's model actors (policy and reward-model Ray actors).

The experience maker only sees log-probs of sampled tokens; the full next-token distribution
exists only inside the policy actor's forward. So the policy statistics are reduced there,
on the actor's device, and only (B, A, d) tensors travel back through Ray.

- ``reduce_policy_stats``: ``PolicyStats`` (B, A, d) of an OpenRLHF ``Actor`` for one
  micro-batch, from the same forward (and so the same temperature-scaled float32 logits) that
  gives OpenRLHF's action log-probs, streamed over the vocabulary one row at a time.
- ``reward_grad_for_actions``: the direction model's reward and input-embedding gradient,
  moved to action coordinates.
- ``bind_credit_methods``: installs ``credit_policy_signals`` / ``credit_reward_signals`` on
  a live actor; run through ``handle.__ray_call__`` so that OpenRLHF's own
  ``RayActorGroup.async_run_method_batch("credit_policy_signals", ...)`` dispatches it
  across the data-parallel ranks exactly like ``forward``. ``export_reward_embedding`` /
  ``import_reward_embedding`` move the direction model's embedding table to the policy
  actors when it lives on the reward-model actors.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Literal

import torch

from backends.openrlhf.layout import (
    action_token_ids,
    check_layout,
    response_to_action_coords,
    split_prompt_response,
)
from credit_core import CreditError, PolicyStats, policy_stats_from_logits
from credit_core.policy_stats import DEFAULT_CHUNK_SIZE

if TYPE_CHECKING:
    from adapters.direction import DirectionModel


@dataclass(frozen=True)
class CreditSignals:
    """The signals of one micro-batch, in action coordinates (B, A[, d]), on the CPU.

    - ``policy_stats``: ``PolicyStats`` of the rollout policy, 0 where ``action_mask`` is False.
    - ``reward_grad`` (B, A, d) float32: dR/d(RM input embedding), 0 off the action tokens.
    - ``direction_reward`` (B,) float32: the direction model's own reward (for logging).
    """

    policy_stats: PolicyStats | None = None
    reward_grad: torch.Tensor | None = None
    direction_reward: torch.Tensor | None = None

    def merged(self, other: CreditSignals) -> CreditSignals:
        """Fields of ``self``, with the ones it lacks taken from ``other``."""
        return CreditSignals(
            policy_stats=self.policy_stats if self.policy_stats is not None else other.policy_stats,
            reward_grad=self.reward_grad if self.reward_grad is not None else other.reward_grad,
            direction_reward=(
                self.direction_reward
                if self.direction_reward is not None
                else other.direction_reward
            ),
        )


def stats_to(stats: PolicyStats, device: torch.device | str) -> PolicyStats:
    """``stats`` with every field moved to ``device``."""
    return PolicyStats(**{f.name: getattr(stats, f.name).to(device) for f in fields(stats)})


def match_vocab(reward_embedding: torch.Tensor, vocab: int) -> torch.Tensor:
    """``reward_embedding`` (V_e, d) with zero rows appended up to the logits' width ``vocab``.

    Model heads are often wider than the tokenizer (padded vocabularies); the extra ids are
    never text, so they get zero embeddings, like policy tokens that decode to nothing.
    """
    rows = reward_embedding.shape[0]
    if rows == vocab:
        return reward_embedding
    if rows > vocab:
        raise CreditError(
            f"reward_embedding: has {rows} rows but the policy's logits have {vocab} entries; "
            "the direction model's embedding must be indexed by the policy vocabulary"
        )
    pad = reward_embedding.new_zeros(vocab - rows, reward_embedding.shape[1])
    return torch.cat([reward_embedding, pad])


@torch.no_grad()
def reduce_policy_stats(
    actor: Any,
    sequences: torch.Tensor,
    action_mask: torch.Tensor,
    attention_mask: torch.Tensor,
    reward_embedding: torch.Tensor,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    ring_attn_group: Any = None,
) -> PolicyStats:
    """``PolicyStats`` (B, A, d) of an OpenRLHF ``Actor`` on one micro-batch.

    Runs ``actor(sequences, action_mask, attention_mask, return_output=True)`` (the forward
    that yields OpenRLHF's action log-probs: its logits are float32 and already divided by the
    sampling temperature), then reduces, per sample, the logits rows of its action span with
    ``credit_core.policy_stats_from_logits`` (vocabulary streamed in ``chunk_size`` tiles).
    Rows are views of the logits, so no (B, A, V) copy is made. Values at positions where
    ``action_mask`` is False are 0. Packed samples (``actor.packing_samples``) are rejected.
    """
    if getattr(actor, "packing_samples", False):
        raise CreditError(
            "policy statistics: packed samples (--ds.packing_samples) are not supported"
        )
    check_layout(sequences, attention_mask, action_mask)
    _, output = actor(
        sequences,
        action_mask,
        attention_mask,
        return_output=True,
        ring_attn_group=ring_attn_group,
    )
    logits = output["logits"]
    B, T = sequences.shape
    A = action_mask.shape[1]
    if logits.dim() != 3 or tuple(logits.shape[:2]) != (B, T):
        raise CreditError(
            f"actor logits: expected shape (B={B}, T={T}, V), got {tuple(logits.shape)}"
        )
    E = match_vocab(reward_embedding, logits.shape[2])
    d = E.shape[1]
    acts = action_mask.bool()
    tokens = action_token_ids(sequences, action_mask)
    offset = T - A
    acc = torch.promote_types(E.dtype, torch.float32)
    p_sampled = logits.new_zeros(B, A, dtype=acc)
    p_sq = logits.new_zeros(B, A, dtype=acc)
    m1 = logits.new_zeros(B, A, d, dtype=acc)
    m2 = logits.new_zeros(B, A, d, dtype=acc)
    emb = logits.new_zeros(B, A, d, dtype=acc)
    for b in range(B):
        cols = torch.nonzero(acts[b]).flatten()
        if cols.numel() == 0:
            continue
        j0, j1 = int(cols[0]), int(cols[-1]) + 1
        rows = logits[b, offset - 1 + j0 : offset - 1 + j1].unsqueeze(0)
        part = policy_stats_from_logits(
            rows, tokens[b, j0:j1].unsqueeze(0), E, temperature=1.0, chunk_size=chunk_size
        )
        p_sampled[b, j0:j1] = part.p_sampled[0]
        p_sq[b, j0:j1] = part.p_sq[0]
        m1[b, j0:j1] = part.m1[0]
        m2[b, j0:j1] = part.m2[0]
        emb[b, j0:j1] = part.sampled_emb[0]
    gaps = ~acts  # observation tokens inside a multi-turn span, prompt, padding
    for per_token in (p_sampled, p_sq):
        per_token.masked_fill_(gaps, 0.0)
    for per_dim in (m1, m2, emb):
        per_dim.masked_fill_(gaps.unsqueeze(2), 0.0)
    return PolicyStats(p_sampled=p_sampled, p_sq=p_sq, m1=m1, m2=m2, sampled_emb=emb)


def reward_grad_for_actions(
    model: DirectionModel,
    sequences: torch.Tensor,
    attention_mask: torch.Tensor,
    action_mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The direction model's (reward (B,), reward gradient (B, A, d)) for an OpenRLHF batch.

    Each sample is cut into prompt and response (``layout.split_prompt_response``), scored
    with one forward and one backward (``DirectionModel.score(with_grad=True)``), and the
    gradient is moved to action coordinates (0 off the action tokens). float32 outputs.
    """
    split = split_prompt_response(sequences, attention_mask, action_mask)
    with torch.enable_grad():
        out = model.score(
            split.prompt_ids,
            split.prompt_mask,
            split.response_ids,
            split.response_mask,
            with_grad=True,
        )
    if out.reward_grad is None:
        raise CreditError(f"{type(model).__name__}.score(with_grad=True) returned no reward_grad")
    grad = response_to_action_coords(out.reward_grad.detach().float(), split, action_mask)
    return grad, out.rewards.detach().float()


@dataclass
class ActorCreditState:
    """What ``bind_credit_methods`` leaves on an actor for one role.

    - ``computes``: signals this actor produces ("policy_stats" on policy actors,
      "reward_grad" on the actors hosting the direction model).
    - ``direction``: ``RewardModelConfig`` fields of the direction model, if hosted here.
    - ``tokenizer``: the policy tokenizer (the direction model is built in its vocabulary).
    - ``stats_chunk_size``: vocabulary tile of the streamed statistics.
    The direction model and the reward embedding are created on first use.
    """

    computes: frozenset[str]
    direction: dict[str, Any] | None
    tokenizer: Any
    stats_chunk_size: int
    direction_model: DirectionModel | None = None
    reward_embedding: torch.Tensor | None = None


def _device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _direction_model(state: ActorCreditState, device: torch.device) -> DirectionModel:
    if state.direction_model is None:
        if state.direction is None:
            raise CreditError("this actor does not host the direction model (no direction set)")
        from adapters.config import RewardModelConfig, build_direction_model

        cfg = RewardModelConfig.model_validate(state.direction)
        state.direction_model = build_direction_model(cfg, state.tokenizer, device=device)
    return state.direction_model


def _reward_embedding(state: ActorCreditState, device: torch.device) -> torch.Tensor:
    if state.reward_embedding is None:
        if state.direction is None:
            raise CreditError(
                "policy statistics need the direction model's embedding table, which was not "
                "shared with this actor (export_reward_embedding / import_reward_embedding)"
            )
        state.reward_embedding = _direction_model(state, device).reward_embedding.detach()
    if state.reward_embedding.device != device:
        state.reward_embedding = state.reward_embedding.to(device)
    return state.reward_embedding


Role = Literal["policy", "reward"]


def signals_method(role: Role) -> str:
    """Name of the bound method that computes ``role``'s signals on an actor."""
    return f"credit_{role}_signals"


def credit_signals(
    actor_self: Any,
    state: ActorCreditState,
    sequences: torch.Tensor,
    action_mask: torch.Tensor,
    attention_mask: torch.Tensor,
) -> CreditSignals:
    """The signals ``state`` says this actor computes, for one micro-batch.

    Bound (with ``actor_self`` and ``state``) as ``actor.credit_<role>_signals`` and called by
    OpenRLHF's ``execute_batch`` with the micro-batch's tensors, on the CPU like ``forward``'s;
    the outputs go back on the CPU. Policy statistics use ``actor_self.actor`` (OpenRLHF's
    ``Actor``); the reward gradient uses the direction model built on first use.
    """
    device = _device()
    seqs = sequences.to(device)
    acts = action_mask.to(device)
    attn = attention_mask.to(device)
    grad = reward = None
    if "reward_grad" in state.computes:
        grad, reward = reward_grad_for_actions(_direction_model(state, device), seqs, attn, acts)
    stats = None
    if "policy_stats" in state.computes:
        E = _reward_embedding(state, device)
        actor_self.actor.eval()
        try:
            stats = reduce_policy_stats(
                actor_self.actor,
                seqs,
                acts,
                attn,
                E,
                chunk_size=state.stats_chunk_size,
                ring_attn_group=getattr(actor_self.strategy, "ring_attn_group", None),
            )
        finally:
            actor_self.actor.train()
    return CreditSignals(
        policy_stats=None if stats is None else stats_to(stats, "cpu"),
        reward_grad=None if grad is None else grad.cpu(),
        direction_reward=None if reward is None else reward.cpu(),
    )


def _state(actor_self: Any, role: Role) -> ActorCreditState:
    states: dict[str, ActorCreditState] = getattr(actor_self, "_credit_states", {})
    if role not in states:
        raise CreditError(
            f"{type(actor_self).__name__} has no {role!r} credit state (bind_credit_methods "
            "was not run on it)"
        )
    return states[role]


def export_reward_embedding(actor_self: Any) -> torch.Tensor:
    """Run through ``__ray_call__`` on a reward-role actor: its direction model's
    embedding table, on the CPU."""
    return _reward_embedding(_state(actor_self, "reward"), _device()).cpu()


def import_reward_embedding(actor_self: Any, reward_embedding: torch.Tensor) -> None:
    """Run through ``__ray_call__`` on a policy-role actor: set the embedding table its
    policy statistics use."""
    _state(actor_self, "policy").reward_embedding = reward_embedding


def bind_credit_methods(actor_self: Any, role: Role, state: ActorCreditState) -> str:
    """Run through ``__ray_call__``: give a live actor ``role``'s state and signals method.

    Sets ``actor_self._credit_states[role] = state`` and the attribute
    ``signals_method(role)``, a callable taking ``sequences``, ``action_mask``,
    ``attention_mask`` (what ``RayActorGroup.async_run_method_batch`` passes). One actor
    may hold both roles. Returns "ClassName@pid", where the binding happened.
    """
    states = actor_self.__dict__.setdefault("_credit_states", {})
    states[role] = state
    setattr(actor_self, signals_method(role), functools.partial(credit_signals, actor_self, state))
    return f"{type(actor_self).__name__}@{os.getpid()}"
