"""Code that runs inside OpenRLHF's model actors (policy and reward-model Ray actors).

The experience maker only sees log-probs of sampled tokens; the full next-token distribution
exists only inside the policy actor's forward. So the policy-side signals are reduced there,
on the actor's device, from OpenRLHF's own log-prob forward (``make_experience`` dispatches
``forward`` to the policy actors; ``bind_credit_methods`` wraps it), and kept until
``compute_advantages_and_returns`` gathers them: a DATC step runs exactly as many policy
forwards as stock OpenRLHF. The logits are reduced to the token entropy H (B, A) when the
strategy reads it (``entropy_top``), and for DATC to a signal that depends on where the
direction model is:

- on the policy actors (placement ``policy``): the reward gradient g is computed first, in
  the wrapped forward, and the logits are reduced straight to DATC's unsigned work W0
  (B, A) (``credit_core.unsigned_work_from_logits``, the strategy's ``work_requires``);
- on the reward-model actors (placement ``reward``): g is not on the policy actor when its
  forward runs, so the logits are reduced to ``PolicyStats`` (B, A, d) and W is formed in the
  experience maker from those and the reward actors' g.

The direction model's signals (g, P2T's attribution r_t = (e_t - e_null) . g_t of it, its
attention over the response, its prefix rewards) come from one scoring call on the actors
hosting it (``direction_signals_for_actions``), with two exceptions:

- a path strategy (``datc_mid``, ``datc_ig``) takes g on the path to the policy's expected
  embeddings m1 (``path_grad_for_actions``), m1 being ``PolicyStats.m1`` of OpenRLHF's own
  log-prob forward: kept on the policy actors (placement ``policy``) or handed to the
  reward-model actors by the experience maker (placement ``reward``);
- on the one-pass path (the direction model is OpenRLHF's reward model, on its actors, g at
  the samples) the reward actor's ``forward`` gives OpenRLHF's reward and g from one forward
  and one backward of OpenRLHF's own ``RewardModel`` (``reward_forward_with_grad``,
  ``one_pass_score``), with r_t formed there for P2T (``one_pass_null``: e_null, read once),
  kept until the signals are gathered.

Functions:

- ``stats_from_logits`` / ``work_from_logits`` / ``entropy_from_logits``: ``PolicyStats`` /
  W0 / H of one micro-batch from an OpenRLHF ``Actor``'s logits (float32, already divided by
  the sampling temperature), streamed over the vocabulary one sample's action span at a time;
  with packed samples the span is a view of the packed (1, N, V) logits
  (``backends.openrlhf.packing``).
- ``reduce_policy_stats``: an ``Actor`` forward plus ``stats_from_logits`` (the fallback, one
  extra forward, when a micro-batch's log-prob forward was not seen).
- ``direction_signals_for_actions``: the direction model's reward and, from the same
  scoring call, the signals asked for (gradient, attention, prefix rewards), moved to action
  coordinates; ``reward_grad_for_actions`` asks for the gradient alone;
  ``path_grad_for_actions`` the path gradient from m1 (``path_problem``: why a model cannot).
- ``reward_and_input_grad``: OpenRLHF's reward and dR/dx from one pass of its
  ``RewardModel``; ``reward_forward_with_grad`` is the reward actor's one-pass ``forward``.
- ``bind_credit_methods``: installs ``credit_policy_signals`` / ``credit_reward_signals`` on
  a live actor, and on a policy actor wraps ``forward`` (on a one-pass reward actor,
  replaces it by ``reward_forward_with_grad``); run through
  ``handle.__ray_call__`` so that OpenRLHF's own
  ``RayActorGroup.async_run_method_batch("credit_policy_signals", ...)`` dispatches it
  across the data-parallel ranks exactly like ``forward``. ``export_reward_embedding`` /
  ``import_reward_embedding`` move the direction model's embedding table to the policy
  actors when it lives on the reward-model actors; ``direction_gives_attention`` and
  ``direction_path_problem`` report what the hosted direction model can give, for the
  start-up check.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import ray
import torch
import torch.distributed as dist

from adapters.direction import embedding_for_vocab, score_rollout
from adapters.grad_path import path_alphas, path_model, path_problem, path_reward_grad
from adapters.input_grad import forward_with_input_and_grad, unwrapped
from adapters.partitioned import gathered, holds_zero3_params
from backends.openrlhf.compat import (
    EMBEDDING_SIGNALS,
    GRADIENT_SIGNALS,
    LOGITS_SIGNALS,
    SCORING_SIGNALS,
)
from backends.openrlhf.forward_capture import CaptureStore, keeping_logits
from backends.openrlhf.layout import (
    action_to_response_coords,
    action_token_ids,
    check_layout,
    response_to_action_coords,
    split_prompt_response,
)
from backends.openrlhf.packing import output_rows, to_padded
from credit_core import (
    CreditError,
    CreditSignals,
    PolicyStats,
    policy_stats_from_logits,
    unsigned_work_from_logits,
)
from credit_core.attribution import DEFAULT_NULL, check_null
from credit_core.policy_stats import DEFAULT_CHUNK_SIZE
from credit_core.token_entropy import token_entropy_from_logits

if TYPE_CHECKING:
    from adapters.direction import DirectionModel


@dataclass(frozen=True)
class ActorSignals:
    """The signals of one micro-batch, in action coordinates (B, A[, d]), on the CPU.

    - ``policy_stats``: ``PolicyStats`` of the rollout policy, 0 where ``action_mask`` is False.
    - ``reward_grad`` (B, A, d) float32: dR/d(RM input embedding), 0 off the action tokens.
    - ``direction_reward`` (B,) float32: the direction model's own reward (for logging).
    - ``unsigned_work`` (B, A) float32: DATC's W0, 0 off the action tokens.
    - ``token_entropy`` (B, A) float32: the rollout policy's entropy H at each action token
      (at the rollout temperature), 0 off the action tokens.
    - ``reward_attention`` (B, A) float32: the direction model's attention over the response,
      renormalized over the action tokens (sum 1 on a row's action tokens, or 0 on the whole
      row), 0 off them.
    - ``prefix_rewards`` (B, A) float32: the direction model's prefix-score differences
      r_t = s_t - s_{t-1}, 0 off the action tokens.
    - ``reward_attribution`` (B, A) float32: P2T's r_t = (e_t - e_null) . g_t from the
      reward gradient of the same pass (``credit_core.attribution``), 0 off the action tokens.
    - ``extra_policy_forwards``: policy forwards run for these signals beyond OpenRLHF's own
      log-prob forward (0 when they were taken from it, 1 for the fallback).
    """

    policy_stats: PolicyStats | None = None
    reward_grad: torch.Tensor | None = None
    direction_reward: torch.Tensor | None = None
    unsigned_work: torch.Tensor | None = None
    token_entropy: torch.Tensor | None = None
    reward_attention: torch.Tensor | None = None
    prefix_rewards: torch.Tensor | None = None
    reward_attribution: torch.Tensor | None = None
    extra_policy_forwards: int = 0

    def credit(self) -> CreditSignals:
        """The signals a credit strategy reads (``credit_core.assign_credit``)."""
        return CreditSignals(
            reward_grad=self.reward_grad,
            policy_stats=self.policy_stats,
            unsigned_work=self.unsigned_work,
            token_entropy=self.token_entropy,
            reward_attention=self.reward_attention,
            prefix_rewards=self.prefix_rewards,
            reward_attribution=self.reward_attribution,
        )

    def logged(self) -> ActorSignals:
        """What the step's diagnostics read of these signals (the direction model's reward,
        the extra forwards), without the signals themselves."""
        return ActorSignals(
            direction_reward=self.direction_reward,
            extra_policy_forwards=self.extra_policy_forwards,
        )

    def merged(self, other: ActorSignals) -> ActorSignals:
        """Fields of ``self``, with the ones it lacks taken from ``other``; forwards add up."""

        def pick(name: str) -> Any:
            mine = getattr(self, name)
            return mine if mine is not None else getattr(other, name)

        return ActorSignals(
            policy_stats=pick("policy_stats"),
            reward_grad=pick("reward_grad"),
            direction_reward=pick("direction_reward"),
            unsigned_work=pick("unsigned_work"),
            token_entropy=pick("token_entropy"),
            reward_attention=pick("reward_attention"),
            prefix_rewards=pick("prefix_rewards"),
            reward_attribution=pick("reward_attribution"),
            extra_policy_forwards=self.extra_policy_forwards + other.extra_policy_forwards,
        )


def _action_spans(
    logits: torch.Tensor,
    sequences: torch.Tensor,
    action_mask: torch.Tensor,
    attention_mask: torch.Tensor,
) -> Iterator[tuple[int, int, int, torch.Tensor, torch.Tensor]]:
    """Per sample with action tokens: (b, j0, j1, logits rows (1, j1 - j0, V), tokens
    (1, j1 - j0)) of the span [j0, j1) of action columns from its first to its last action
    token. Rows are views of ``logits``: the row of sequence position i predicts token
    i + 1. ``logits`` is (B, T, V), or (1, N, V) from OpenRLHF's packed forward
    (``--ds.packing_samples``: the N attended tokens of the micro-batch in one row,
    ``packing.OutputRows``), read per packed sample without unpacking.
    """
    B, T = sequences.shape
    A = action_mask.shape[1]
    if logits.dim() != 3:
        raise CreditError(
            f"actor logits: expected shape (B, T, V) or (1, N, V), got {tuple(logits.shape)}"
        )
    rows_of = output_rows(logits, attention_mask)
    acts = action_mask.bool()
    tokens = action_token_ids(sequences, action_mask)
    offset = T - A
    for b in range(B):
        cols = torch.nonzero(acts[b]).flatten()
        if cols.numel() == 0:
            continue
        j0, j1 = int(cols[0]), int(cols[-1]) + 1
        rows = rows_of.span(logits, b, offset - 1 + j0, offset - 1 + j1)
        yield b, j0, j1, rows, tokens[b, j0:j1].unsqueeze(0)


@torch.no_grad()
def stats_from_logits(
    logits: torch.Tensor,
    sequences: torch.Tensor,
    action_mask: torch.Tensor,
    attention_mask: torch.Tensor,
    reward_embedding: torch.Tensor,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> PolicyStats:
    """``PolicyStats`` (B, A, d) from an OpenRLHF ``Actor``'s logits (B, T, V) of one
    micro-batch, or (1, N, V) of its packed forward (``_action_spans``), float32 and already
    divided by the sampling temperature, reduced per sample
    over its action span with ``credit_core.policy_stats_from_logits`` (vocabulary streamed in
    ``chunk_size`` tiles); no (B, A, V) copy is made. 0 where ``action_mask`` is False."""
    check_layout(sequences, attention_mask, action_mask)
    E = embedding_for_vocab(reward_embedding, logits.shape[2])
    B, A, d = sequences.shape[0], action_mask.shape[1], E.shape[1]
    acc = torch.promote_types(E.dtype, torch.float32)
    p_sampled = logits.new_zeros(B, A, dtype=acc)
    p_sq = logits.new_zeros(B, A, dtype=acc)
    m1 = logits.new_zeros(B, A, d, dtype=acc)
    m2 = logits.new_zeros(B, A, d, dtype=acc)
    emb = logits.new_zeros(B, A, d, dtype=acc)
    for b, j0, j1, rows, tokens in _action_spans(logits, sequences, action_mask, attention_mask):
        part = policy_stats_from_logits(rows, tokens, E, temperature=1.0, chunk_size=chunk_size)
        p_sampled[b, j0:j1] = part.p_sampled[0]
        p_sq[b, j0:j1] = part.p_sq[0]
        m1[b, j0:j1] = part.m1[0]
        m2[b, j0:j1] = part.m2[0]
        emb[b, j0:j1] = part.sampled_emb[0]
    gaps = ~action_mask.bool()  # observation tokens inside a multi-turn span, prompt, padding
    for per_token in (p_sampled, p_sq):
        per_token.masked_fill_(gaps, 0.0)
    for per_dim in (m1, m2, emb):
        per_dim.masked_fill_(gaps.unsqueeze(2), 0.0)
    return PolicyStats(p_sampled=p_sampled, p_sq=p_sq, m1=m1, m2=m2, sampled_emb=emb)


@torch.no_grad()
def work_from_logits(
    logits: torch.Tensor,
    sequences: torch.Tensor,
    action_mask: torch.Tensor,
    attention_mask: torch.Tensor,
    reward_embedding: torch.Tensor,
    reward_grad: torch.Tensor,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> torch.Tensor:
    """DATC's unsigned work W0 (B, A) from an OpenRLHF ``Actor``'s logits (as
    ``stats_from_logits``) and the reward gradient g (B, A, d) in action coordinates, reduced
    per sample with ``credit_core.unsigned_work_from_logits`` (kernel chosen by d); float32
    (float64 for float64 E or g), 0 where ``action_mask`` is False."""
    check_layout(sequences, attention_mask, action_mask)
    E = embedding_for_vocab(reward_embedding, logits.shape[2])
    B, A = action_mask.shape
    if tuple(reward_grad.shape) != (B, A, E.shape[1]):
        raise CreditError(
            f"reward_grad: expected shape (B={B}, A={A}, d={E.shape[1]}), "
            f"got {tuple(reward_grad.shape)}"
        )
    acc = torch.promote_types(torch.promote_types(E.dtype, reward_grad.dtype), torch.float32)
    work = logits.new_zeros(B, A, dtype=acc)
    for b, j0, j1, rows, tokens in _action_spans(logits, sequences, action_mask, attention_mask):
        g = reward_grad[b, j0:j1].unsqueeze(0).to(logits.device)
        part = unsigned_work_from_logits(rows, tokens, E, g, chunk_size=chunk_size)
        work[b, j0:j1] = part[0]
    return work.masked_fill_(~action_mask.bool(), 0.0)


@torch.no_grad()
def entropy_from_logits(
    logits: torch.Tensor,
    sequences: torch.Tensor,
    action_mask: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> torch.Tensor:
    """The policy's entropy H (B, A) at each action token from an OpenRLHF ``Actor``'s
    logits (as ``stats_from_logits``: float32 and already divided by the sampling
    temperature, so H is the rollout policy's at the rollout temperature), reduced per
    sample with ``credit_core.token_entropy.token_entropy_from_logits``; float32 (float64
    for float64 logits), 0 where ``action_mask`` is False."""
    check_layout(sequences, attention_mask, action_mask)
    B, A = action_mask.shape
    entropy = logits.new_zeros(B, A, dtype=torch.promote_types(logits.dtype, torch.float32))
    for b, j0, j1, rows, _ in _action_spans(logits, sequences, action_mask, attention_mask):
        entropy[b, j0:j1] = token_entropy_from_logits(rows, chunk_size=chunk_size)[0]
    return entropy.masked_fill_(~action_mask.bool(), 0.0)


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
    """``PolicyStats`` (B, A, d) of an OpenRLHF ``Actor`` on one micro-batch, with a forward
    of its own: ``actor(sequences, action_mask, attention_mask, return_output=True)`` (the
    forward that yields OpenRLHF's action log-probs), then ``stats_from_logits``. Values at
    positions where ``action_mask`` is False are 0. With packed samples
    (``actor.packing_samples``) the statistics are read from the packed logits.
    """
    _, output = actor(
        sequences,
        action_mask,
        attention_mask,
        return_output=True,
        ring_attn_group=ring_attn_group,
    )
    return stats_from_logits(
        output["logits"],
        sequences,
        action_mask,
        attention_mask,
        reward_embedding,
        chunk_size=chunk_size,
    )


def direction_signals_for_actions(
    model: DirectionModel,
    sequences: torch.Tensor,
    attention_mask: torch.Tensor,
    action_mask: torch.Tensor,
    signals: frozenset[str],
    null: str = DEFAULT_NULL,
) -> ActorSignals:
    """The direction model's reward (B,) and the ``signals`` asked for (a subset of
    ``SCORING_SIGNALS``) for an OpenRLHF batch, from ONE scoring call.

    Each sample is cut into prompt and response (``layout.split_prompt_response``) and
    scored with ``adapters.direction.score_rollout``: ``with_grad`` (one backward) for
    "reward_grad" and for "reward_attribution" (P2T's r_t = (E'[y_t] - e_null) . g_t of that
    gradient, ``DirectionModel.attribution`` with the null embedding ``null``; the gradient
    itself is returned only when asked for), ``with_attention`` for "reward_attention",
    ``with_prefix_rewards`` (the model's extra no-grad prefix passes, if it needs them) for
    "prefix_rewards"; an option is passed only when its signal is asked for. The outputs
    move to action coordinates (0 off the action tokens; observation tokens of a multi-turn
    sample are scored but get no value); the attention is renormalized over the action tokens
    (``ActorSignals.reward_attention``). float32 outputs. Raises ``CreditError`` naming the
    output the model cannot give or did not return.
    """
    unknown = sorted(signals - SCORING_SIGNALS)
    if unknown:
        raise CreditError(
            f"direction signals: expected a subset of {sorted(SCORING_SIGNALS)}, got {unknown}"
        )
    split = split_prompt_response(sequences, attention_mask, action_mask)
    with_grad = bool(signals & GRADIENT_SIGNALS)
    with torch.set_grad_enabled(with_grad):
        out = score_rollout(
            model,
            split.prompt_ids,
            split.prompt_mask,
            split.response_ids,
            split.response_mask,
            with_grad=with_grad,
            with_attention="reward_attention" in signals,
            with_prefix_rewards="prefix_rewards" in signals,
        )

    def moved(value: torch.Tensor | None) -> torch.Tensor | None:
        if value is None:
            return None
        return response_to_action_coords(value.detach().float(), split, action_mask)

    if with_grad and out.reward_grad is None:
        raise CreditError(f"{type(model).__name__}.score(with_grad=True) returned no reward_grad")
    attribution = None
    if "reward_attribution" in signals:
        assert out.reward_grad is not None  # checked above
        attribution = model.attribution(
            out.reward_grad.detach(), split.response_ids, split.response_mask, null
        )
    attention = moved(out.attention)
    return ActorSignals(
        reward_grad=moved(out.reward_grad) if "reward_grad" in signals else None,
        direction_reward=out.rewards.detach().float(),
        reward_attention=None if attention is None else _renormalized(attention),
        prefix_rewards=moved(out.prefix_rewards),
        reward_attribution=moved(attribution),
    )


def _renormalized(attention: torch.Tensor) -> torch.Tensor:
    """Rows (B, A) >= 0 divided by their sums; a row summing to 0 stays 0."""
    total = attention.sum(dim=1, keepdim=True)
    return torch.where(total > 0, attention / torch.where(total > 0, total, 1.0), 0.0)


def reward_grad_for_actions(
    model: DirectionModel,
    sequences: torch.Tensor,
    attention_mask: torch.Tensor,
    action_mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The direction model's (reward (B,), reward gradient (B, A, d)) for an OpenRLHF batch:
    ``direction_signals_for_actions`` asking for "reward_grad" alone (one forward and one
    backward pass)."""
    found = direction_signals_for_actions(
        model, sequences, attention_mask, action_mask, frozenset({"reward_grad"})
    )
    assert found.reward_grad is not None  # asked for: checked there
    assert found.direction_reward is not None  # always set there
    return found.reward_grad, found.direction_reward


def path_grad_for_actions(
    model: DirectionModel,
    sequences: torch.Tensor,
    attention_mask: torch.Tensor,
    action_mask: torch.Tensor,
    m1: torch.Tensor,
    points: int,
) -> torch.Tensor:
    """The reward gradient (B, A, d) float32 of an OpenRLHF batch taken on the path to the
    policy's expected embeddings (docs/design.md, "Curvature-robust direction"): the mean of
    dR/dx at x(a) = E[y] + a (m1 - E[y]) over a in ``path_alphas(points)``, with
    ``adapters.grad_path.path_reward_grad`` (``points`` RM forward + backward passes, no
    reward forward at the sampled tokens: OpenRLHF's reward model gives the reward).

    ``m1`` (B, A, d): the policy's expected embeddings in action coordinates (``PolicyStats
    .m1`` of OpenRLHF's own log-prob forward). Only action tokens move along the path:
    observation tokens of a multi-turn sample stay at their embeddings, as the prompt does.
    0 off the action tokens. ``CreditError`` when ``model`` cannot take it (``path_problem``).
    """
    model = path_model(model)
    B, A = action_mask.shape
    if m1.dim() != 3 or tuple(m1.shape[:2]) != (B, A):
        raise CreditError(
            f"m1: expected shape (B={B}, A={A}, d) (action coordinates), got {tuple(m1.shape)}"
        )
    split = split_prompt_response(sequences, attention_mask, action_mask)
    moved, is_action = action_to_response_coords(m1, split, action_mask)
    acc = torch.promote_types(model.table.dtype, torch.float32)
    table = model.table.to(moved.device)
    sampled = table[split.response_ids.to(moved.device)].to(acc)
    target = torch.where(is_action.unsqueeze(2), moved.to(acc), sampled)
    grad = path_reward_grad(
        model,
        split.prompt_ids,
        split.prompt_mask,
        split.response_ids,
        split.response_mask,
        target,
        path_alphas(points),
    )
    return response_to_action_coords(grad.detach().float(), split, action_mask)


def reward_and_input_grad(
    model: Any,
    sequences: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    ring_attn_group: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OpenRLHF's reward (B,) and its gradient w.r.t. the reward model's input embeddings
    (B, T, d), from ONE forward and ONE backward pass of OpenRLHF's own reward model.

    ``model`` is what a ``RewardModelActor`` holds (OpenRLHF's ``RewardModel``, possibly in a
    DeepSpeed engine); the ``RewardModel`` is called exactly as ``RewardModelActor.forward``
    calls it (``pad_sequence=True``), inside the engine (``adapters.input_grad``: the
    engine's own ``forward`` would refuse the backward; the rewards are bitwise the
    engine's). Under ZeRO-3 the forward and the backward are collectives every process must
    enter, as stock OpenRLHF's forward is, and the engine's gathered weights are released
    after them (``forward_with_input_and_grad``). The reward is
    OpenRLHF's (its pooling at the last attended
    token, value head, ``--reward.normalize_enable`` mean/std), with gradients enabled: a
    forward hook on its input-embedding module makes that module's output E[sequences] a
    leaf, and ``torch.autograd.grad`` of the summed reward gives dR/dx there (the weights
    are frozen for the call, no weight gradient is formed). The gradient is in the model's
    dtype, 0 where nothing reaches the reward (padding). With packed samples (the model's
    ``packing_samples``: it unpads the micro-batch into one row itself) the embeddings are
    (1, N, d) and their gradient is scattered to (B, T, d) (``packing.to_padded``).
    """
    found = one_pass_score(model, sequences, attention_mask, ring_attn_group=ring_attn_group)
    assert found.grad is not None  # kept unless a null embedding is given
    return found.reward, found.grad


@dataclass(frozen=True)
class OnePassScore:
    """What one pass of OpenRLHF's reward model gives a micro-batch, in the padded layout
    (B, T): ``reward`` (B,); ``grad`` (B, T, d) dR/dx in the model's dtype, or None where
    only the attribution is kept; ``attribution`` (B, T) float32 P2T's r_t, or None."""

    reward: torch.Tensor
    grad: torch.Tensor | None
    attribution: torch.Tensor | None = None

    def cpu(self) -> OnePassScore:
        """The same on the CPU (what the actor keeps until the signals are gathered)."""
        return OnePassScore(
            self.reward.cpu(),
            None if self.grad is None else self.grad.cpu(),
            None if self.attribution is None else self.attribution.cpu(),
        )


def one_pass_score(
    model: Any,
    sequences: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    ring_attn_group: Any = None,
    null_embedding: torch.Tensor | None = None,
    keep_grad: bool = True,
) -> OnePassScore:
    """``reward_and_input_grad`` (its one forward and one backward), with, given the null
    embedding e_null (d,), P2T's r_t = (x_t - e_null) . g_t (B, T) float32 of the same pass
    (docs/design.md, "Gradient x input attribution (P2T)"): x_t is the input embedding the
    forward read (OpenRLHF's reward model reads the policy's token ids, so x_t is its table
    row of token t), g_t its gradient; ``keep_grad`` False drops g once r_t is formed (only
    the (B, T) signal is kept). 0 off the attended positions."""
    reward, x, grad = forward_with_input_and_grad(
        model,
        lambda module: module(
            sequences,
            attention_mask,
            ring_attn_group=ring_attn_group,
            pad_sequence=True,
            packed_seq_lens=None,
        ),
        lambda out: out,
    )
    attribution = None
    if null_embedding is not None:
        g = grad.float()
        r = torch.einsum("...d,...d->...", x.float(), g) - g @ null_embedding.to(g)
        attribution = to_padded(r, attention_mask)
    kept = to_padded(grad, attention_mask) if keep_grad or null_embedding is None else None
    return OnePassScore(reward.detach(), kept, attribution)


def reward_forward_with_grad(
    actor_self: Any,
    state: ActorCreditState,
    stock_forward: Callable[..., Any],
    sequences: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    packed_seq_lens: Any = None,
    pad_sequence: bool = False,
) -> torch.Tensor:
    """OpenRLHF's ``RewardModelActor.forward`` (bound as the reward actor's ``forward`` by
    ``bind_credit_methods`` for the one-pass path): the same reward, on the CPU, from
    ``one_pass_score``, whose input gradient (or P2T's attribution of it) is kept in
    ``state.scored`` until
    ``credit_signals`` collects it for the same micro-batch. The stock forward calls the
    model under ``torch.no_grad()``, which is why the call is made here rather than through
    it. A call this path does not cover (explicit ``packed_seq_lens``, which OpenRLHF 0.11's
    experience maker never passes: with ``--ds.packing_samples`` the model packs the padded
    micro-batch itself, which ``reward_and_input_grad`` follows) goes to ``stock_forward``.
    """
    if attention_mask is None or packed_seq_lens is not None:
        return stock_forward(sequences, attention_mask, packed_seq_lens, pad_sequence)  # type: ignore[no-any-return]
    found = _one_pass(actor_self, state, sequences, attention_mask)
    state.scored.put(sequences, attention_mask, found.cpu())
    return found.reward.to("cpu")


def _one_pass(
    actor_self: Any, state: ActorCreditState, sequences: torch.Tensor, attention_mask: torch.Tensor
) -> OnePassScore:
    """``one_pass_score`` of a micro-batch on a one-pass reward actor: the gradient kept when
    the state computes "reward_grad", P2T's attribution when it computes
    "reward_attribution" (with the state's null embedding, ``one_pass_null``)."""
    device = _device()
    attributes = "reward_attribution" in state.computes
    return one_pass_score(
        actor_self.model,
        sequences.to(device),
        attention_mask.to(device),
        ring_attn_group=getattr(actor_self.strategy, "ring_attn_group", None),
        null_embedding=one_pass_null(actor_self, state).to(device) if attributes else None,
        keep_grad="reward_grad" in state.computes,
    )


def _one_pass_signals(
    actor_self: Any,
    state: ActorCreditState,
    sequences: torch.Tensor,
    action_mask: torch.Tensor,
    attention_mask: torch.Tensor,
) -> ActorSignals:
    """The reward gradient (B, A, d) float32 and/or P2T's attribution (B, A) float32 (what
    the state computes) in action coordinates and OpenRLHF's reward, as the one-pass forward
    kept them for this micro-batch (or, if that forward was not seen, from one more pass
    now).

    Under ZeRO-3 that pass is a collective while whether a micro-batch was seen may differ
    between the reward-model actors: they agree (``_any_process``, once per micro-batch:
    OpenRLHF dispatches as many to each actor as their forwards), and every actor runs the
    pass when one needs it, an actor that kept its micro-batch's gradient dropping the
    result."""
    check_layout(sequences, attention_mask, action_mask)
    kept = state.scored.take(sequences, attention_mask)
    needed = kept is None
    if holds_zero3_params([unwrapped(actor_self.model)]):
        needed = _any_process(needed)
    if needed:
        found = _one_pass(actor_self, state, sequences, attention_mask)
        if kept is None:
            kept = found.cpu()
    assert kept is not None  # taken, or computed just now
    T, A = sequences.shape[1], action_mask.shape[1]
    on = action_mask.bool().cpu()
    reward_grad = attribution = None
    if kept.grad is not None and "reward_grad" in state.computes:
        reward_grad = torch.where(on.unsqueeze(2), kept.grad[:, T - A :].float(), 0.0)
    if kept.attribution is not None:
        attribution = torch.where(on, kept.attribution[:, T - A :].float(), 0.0)
    return ActorSignals(
        reward_grad=reward_grad,
        direction_reward=kept.reward.float(),
        reward_attribution=attribution,
    )


def null_token_id(null: str, tokenizer: Any) -> int | None:
    """The token whose embedding row is P2T's null embedding ``null`` on the one-pass path
    (OpenRLHF's reward model reads the policy's token ids, so the token is the policy
    tokenizer's): ``pad``, the id OpenRLHF pads with (the tokenizer's pad token, else its
    eos token); ``unk``, its unknown token; None for ``zero`` (no row). Needs no model: the
    maker checks it when it is installed. ``CreditError`` naming ``null`` when the tokenizer
    lacks the token."""
    kind = check_null(null)
    if kind == "zero":
        return None
    if kind == "pad":
        token = getattr(tokenizer, "pad_token_id", None)
        if token is None:
            token = getattr(tokenizer, "eos_token_id", None)
    else:
        token = getattr(tokenizer, "unk_token_id", None)
    if not isinstance(token, int):
        raise CreditError(
            f"null: {kind!r} needs the tokenizer's "
            f"{'pad (or eos)' if kind == 'pad' else 'unknown'} token, but "
            f"{type(tokenizer).__name__} has none; use null: "
            f"{'zero' if kind == 'pad' else 'pad or zero'}"
        )
    return token


def one_pass_null(actor_self: Any, state: ActorCreditState) -> torch.Tensor:
    """e_null (d,) float32 of a one-pass reward actor: the input-embedding row of its
    model at ``null_token_id(state.attribution_null, state.tokenizer)``, or zeros for
    ``zero``. Read once and kept on the state: the maker reads it on every reward actor
    before the first step's forwards (``prepare_attribution``; under ZeRO-3 the row is
    gathered, a collective every actor enters)."""
    if state.null_embedding is not None:
        return state.null_embedding
    token = null_token_id(state.attribution_null, state.tokenizer)
    param = unwrapped(actor_self.model).get_input_embeddings().weight
    with gathered(param):
        d = int(param.shape[1])
        row = torch.zeros(d) if token is None else param.detach()[token].float().cpu().clone()
    state.null_embedding = row
    return row


def prepare_attribution(actor_self: Any, role: Role) -> str | None:
    """Run through ``__ray_call__`` on every actor hosting ``role``'s reward gradient when
    the strategy reads ``reward_attribution``: read (and keep) its null embedding (the
    one-pass reward model's row, ``one_pass_null``; else the direction model's,
    ``DirectionModel.null_embedding``, building the model); why it cannot (the message of
    the ``CreditError``), or None."""
    state = _state(actor_self, role)
    try:
        if state.one_pass:
            one_pass_null(actor_self, state)
        else:
            _direction_model(state, _device()).null_embedding(state.attribution_null)
    except CreditError as err:
        return str(err)
    return None


def _any_process(flag: bool) -> bool:
    """Whether ``flag`` holds on any process of the default ``torch.distributed`` group
    (the reward-model actors' group; one all-reduce, on the actor's device as NCCL needs),
    or ``flag`` itself without a group."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    value = torch.tensor([int(flag)], device=_device())
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


@dataclass
class ActorCreditState:
    """What ``bind_credit_methods`` leaves on an actor for one role.

    - ``computes``: signals this actor produces (``LOGITS_SIGNALS`` on policy actors,
      ``SCORING_SIGNALS`` on the actors hosting the direction model); "unsigned_work"
      needs the direction model on the same actor (g is computed before the logits exist).
    - ``direction``: ``RewardModelConfig`` fields of the direction model, if hosted here.
    - ``tokenizer``: the policy tokenizer (the direction model is built in its vocabulary).
    - ``stats_chunk_size``: vocabulary tile of the streamed statistics.
    - ``captured``: the signals taken from the policy's log-prob forwards, per micro-batch,
      until ``credit_signals`` collects them.
    - ``path_points``: the strategy's ``reward_grad_points``; n >= 1: "reward_grad" is the
      path gradient (``path_grad_for_actions``) from the policy's m1 of the micro-batch.
    - ``one_pass``: on a reward-model actor, "reward_grad" comes from OpenRLHF's own reward
      forward (``reward_forward_with_grad``: reward and input gradient from one forward and
      one backward); no direction model is built, the embedding table is the RM's.
    - ``scored``: the ``OnePassScore`` of each one-pass forward, on the CPU, keyed by the
      micro-batch's ``sequences`` and ``attention_mask``.
    - ``attribution_null``: the null embedding of "reward_attribution" (the strategy's
      ``attribution_null``); ``null_embedding``: its vector on a one-pass actor, read once.
    - ``score_samples``: with ``path_points`` >= 1, the direction model (not OpenRLHF's
      reward model) also scores the sampled responses, one no-grad forward, since the path's
      passes give no score at the samples: ``direction_reward``, for the step's agreement
      with the reward (``backends.openrlhf.credit``).
    The direction model and the reward embedding are created on first use.
    """

    computes: frozenset[str]
    direction: dict[str, Any] | None
    tokenizer: Any
    stats_chunk_size: int
    direction_model: DirectionModel | None = None
    reward_embedding: torch.Tensor | None = None
    captured: CaptureStore[ActorSignals] = field(default_factory=CaptureStore)
    path_points: int = 0
    one_pass: bool = False
    scored: CaptureStore[OnePassScore] = field(default_factory=CaptureStore)
    attribution_null: str = DEFAULT_NULL
    null_embedding: torch.Tensor | None = None
    score_samples: bool = False

    @property
    def one_pass_gradient(self) -> bool:
        """Whether the one-pass reward forward gives this actor's gradient signals."""
        return self.one_pass and bool(self.computes & GRADIENT_SIGNALS)

    def __post_init__(self) -> None:
        if "unsigned_work" in self.computes and self.direction is None:
            raise CreditError(
                "unsigned_work: the reward gradient must be computed on the policy actor "
                "before its forward, but this actor does not host the direction model"
            )


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


def _padded_to_head(state: ActorCreditState, vocab: int) -> torch.Tensor:
    """The state's reward embedding with zero rows up to the LM head's ``vocab`` outputs
    (``embedding_for_vocab``), padded once: the padded (V, d) table replaces the state's, so
    later micro-batches reuse it instead of concatenating a new one each time."""
    table = state.reward_embedding
    assert table is not None  # _reward_embedding ran first
    if table.shape[0] != vocab:
        table = state.reward_embedding = embedding_for_vocab(table, vocab)
    return table


Role = Literal["policy", "reward"]


def signals_method(role: Role) -> str:
    """Name of the bound method that computes ``role``'s signals on an actor."""
    return f"credit_{role}_signals"


Result = TypeVar("Result")


def _signals_around_forward(
    actor_self: Any,
    state: ActorCreditState,
    sequences: torch.Tensor,
    action_mask: torch.Tensor,
    attention_mask: torch.Tensor,
    run_forward: Callable[[], Result],
) -> tuple[Result, ActorSignals]:
    """Run ``run_forward`` (a call of ``actor_self.actor`` on this micro-batch) with its
    logits reduced to the logits signals in ``state.computes``; return its result and them.

    For "unsigned_work" the direction model's g is computed first (its memory is freed
    before the policy forward runs), with the other ``SCORING_SIGNALS`` in
    ``state.computes`` from the same scoring call, and W0 is reduced from the logits; for
    "policy_stats" the logits are reduced to ``PolicyStats``, for "token_entropy" to H.
    Outputs go to the CPU.
    """
    device = _device()
    scored = ActorSignals()
    if "unsigned_work" in state.computes:
        scored = direction_signals_for_actions(
            _direction_model(state, device),
            sequences.to(device),
            attention_mask.to(device),
            action_mask.to(device),
            (state.computes & SCORING_SIGNALS) | {"reward_grad"},
            state.attribution_null,
        )
    grad = scored.reward_grad
    if state.computes & EMBEDDING_SIGNALS:
        _reward_embedding(state, device)
    chunk = state.stats_chunk_size
    found: list[ActorSignals] = []

    def on_logits(
        logits: torch.Tensor, seqs: torch.Tensor, acts: torch.Tensor, attn: torch.Tensor
    ) -> None:
        stats = work = entropy = None
        if state.computes & EMBEDDING_SIGNALS:
            E = _padded_to_head(state, logits.shape[2])
            if "policy_stats" in state.computes:
                stats = stats_from_logits(logits, seqs, acts, attn, E, chunk_size=chunk)
            if grad is not None:
                work = work_from_logits(logits, seqs, acts, attn, E, grad, chunk_size=chunk)
        if "token_entropy" in state.computes:
            entropy = entropy_from_logits(logits, seqs, acts, attn, chunk_size=chunk)
        found.append(
            ActorSignals(
                policy_stats=None if stats is None else stats.to("cpu"),
                unsigned_work=None if work is None else work.cpu(),
                token_entropy=None if entropy is None else entropy.cpu(),
            )
        )

    with keeping_logits(actor_self.actor, on_logits):
        result = run_forward()
    if len(found) != 1:
        raise CreditError(
            f"policy forward: expected one call of the actor with an action mask, got {len(found)}"
        )
    if "reward_grad" not in state.computes:
        scored = replace(scored, reward_grad=None)
    return result, found[0].merged(_to_cpu(scored))


def policy_forward_with_credit(
    actor_self: Any,
    state: ActorCreditState,
    stock_forward: Callable[..., Any],
    sequences: torch.Tensor,
    action_mask: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    **kwargs: Any,
) -> Any:
    """OpenRLHF's policy-actor ``forward`` (``stock_forward``), unchanged in what it returns,
    with the credit signals of the micro-batch taken from its logits and kept in
    ``state.captured`` (bound by ``bind_credit_methods`` as the actor's ``forward``)."""
    if action_mask is None or attention_mask is None:
        return stock_forward(sequences, action_mask, attention_mask, **kwargs)
    result, signals = _signals_around_forward(
        actor_self,
        state,
        sequences,
        action_mask,
        attention_mask,
        lambda: stock_forward(sequences, action_mask, attention_mask, **kwargs),
    )
    state.captured.put(sequences, action_mask, signals)
    return result


def _extra_forward_signals(
    actor_self: Any,
    state: ActorCreditState,
    sequences: torch.Tensor,
    action_mask: torch.Tensor,
    attention_mask: torch.Tensor,
) -> ActorSignals:
    """The logits signals with a forward of their own (eval mode, no grad): the fallback for
    a micro-batch whose log-prob forward was not seen."""
    device = _device()
    actor = actor_self.actor
    ring = getattr(actor_self.strategy, "ring_attn_group", None)
    seqs, acts, attn = sequences.to(device), action_mask.to(device), attention_mask.to(device)

    def run() -> Any:
        with torch.no_grad():
            return actor(seqs, acts, attn, ring_attn_group=ring)

    actor.eval()
    try:
        _, signals = _signals_around_forward(actor_self, state, seqs, acts, attn, run)
    finally:
        actor.train()
    return replace(signals, extra_policy_forwards=1)


def credit_signals(
    actor_self: Any,
    state: ActorCreditState,
    sequences: torch.Tensor,
    action_mask: torch.Tensor,
    attention_mask: torch.Tensor,
    policy_signals: ActorSignals | Any = None,
) -> ActorSignals:
    """The signals ``state`` says this actor computes, for one micro-batch.

    Bound (with ``actor_self`` and ``state``) as ``actor.credit_<role>_signals`` and called by
    OpenRLHF's ``execute_batch`` with the micro-batch's tensors, on the CPU like ``forward``'s;
    the outputs go back on the CPU. ``LOGITS_SIGNALS`` are the ones kept from this
    micro-batch's log-prob forward, or, if that forward was not seen, computed with one extra
    forward of ``actor_self.actor`` (counted in ``extra_policy_forwards``). "reward_grad" is,
    on the one-pass path (``state.one_pass``), the one kept from OpenRLHF's reward forward;
    for a path strategy (``state.path_points``), the path gradient from the policy's m1
    (B, A, d): that of ``policy_signals`` (the policy actors' ``ActorSignals`` of this
    micro-batch, or a Ray reference to them, fetched here) when the experience maker hands
    them over (the direction model on the reward-model actors), else that of the statistics
    kept here (on the policy actors). The other ``SCORING_SIGNALS`` not computed yet (the W0
    path takes g in the forward) come from one scoring call of the direction model, built on
    first use; so does the direction model's score of the samples where ``state
    .score_samples`` asks for it and no pass gave it (a no-grad forward).
    """
    signals = ActorSignals()
    if state.computes & LOGITS_SIGNALS:
        taken = state.captured.take(sequences, action_mask)
        if taken is None:
            taken = _extra_forward_signals(
                actor_self, state, sequences, action_mask, attention_mask
            )
        signals = taken
    if state.one_pass_gradient:
        scored = _one_pass_signals(actor_self, state, sequences, action_mask, attention_mask)
        signals = signals.merged(scored)
    missing = frozenset(
        name for name in state.computes & SCORING_SIGNALS if getattr(signals, name) is None
    )
    device = _device()
    if "reward_grad" in missing and state.path_points:
        if policy_signals is not None and not isinstance(policy_signals, ActorSignals):
            policy_signals = ray.get(policy_signals)
        m1 = _m1_of(policy_signals if policy_signals is not None else signals)
        grad = path_grad_for_actions(
            _direction_model(state, device),
            sequences.to(device),
            attention_mask.to(device),
            action_mask.to(device),
            m1.to(device),
            state.path_points,
        )
        signals = signals.merged(ActorSignals(reward_grad=grad.cpu()))
        missing = missing - {"reward_grad"}
    if missing or (state.score_samples and signals.direction_reward is None):
        scored = direction_signals_for_actions(
            _direction_model(state, device),
            sequences.to(device),
            attention_mask.to(device),
            action_mask.to(device),
            missing,
            state.attribution_null,
        )
        signals = signals.merged(_to_cpu(scored))
    return signals


def _m1_of(signals: ActorSignals) -> torch.Tensor:
    """The policy's expected embeddings m1 (B, A, d) of one micro-batch's policy signals."""
    if signals.policy_stats is None:
        raise CreditError(
            "expected embeddings: the path gradient (datc_mid, datc_ig) needs the policy's "
            "m1 of this micro-batch, which was neither handed over nor kept here"
        )
    return signals.policy_stats.m1


def _to_cpu(signals: ActorSignals) -> ActorSignals:
    """The direction model's outputs of ``signals`` on the CPU (what crosses Ray)."""

    def cpu(value: torch.Tensor | None) -> torch.Tensor | None:
        return None if value is None else value.cpu()

    return replace(
        signals,
        reward_grad=cpu(signals.reward_grad),
        direction_reward=cpu(signals.direction_reward),
        reward_attention=cpu(signals.reward_attention),
        prefix_rewards=cpu(signals.prefix_rewards),
        reward_attribution=cpu(signals.reward_attribution),
    )


def _state(actor_self: Any, role: Role) -> ActorCreditState:
    states: dict[str, ActorCreditState] = getattr(actor_self, "_credit_states", {})
    if role not in states:
        raise CreditError(
            f"{type(actor_self).__name__} has no {role!r} credit state (bind_credit_methods "
            "was not run on it)"
        )
    return states[role]


def export_reward_embedding(actor_self: Any, keep: bool = True) -> torch.Tensor | None:
    """Run through ``__ray_call__`` on every reward-role actor: its direction model's
    embedding table, on the CPU; on the one-pass path, OpenRLHF's reward model's own input
    embedding table (float32), cut to the policy tokenizer's length (a padded RM
    vocabulary may be wider than the policy's LM head; the policy statistics pad it to the
    head where it is narrower). Under ZeRO-3 that table is a partition, gathered for the
    copy (``adapters.partitioned.gathered``: a collective, hence the call on every actor).
    ``keep`` False: the actor takes part and returns None (one copy crosses Ray)."""
    state = _state(actor_self, "reward")
    if state.one_pass:
        param = unwrapped(actor_self.model).get_input_embeddings().weight
        with gathered(param):
            weight = param.detach()
            if hasattr(state.tokenizer, "__len__"):  # rows past the tokenizer are never text
                weight = weight[: len(state.tokenizer)]
            table = weight.float().cpu()
        return table if keep else None
    table = _reward_embedding(state, _device()).cpu()
    return table if keep else None


def import_reward_embedding(actor_self: Any, reward_embedding: torch.Tensor) -> None:
    """Run through ``__ray_call__`` on a policy-role actor: set the embedding table its
    policy statistics use."""
    _state(actor_self, "policy").reward_embedding = reward_embedding


def direction_gives_attention(actor_self: Any, role: Role) -> bool:
    """Run through ``__ray_call__`` on an actor hosting the direction model (``role``'s
    state has a ``direction``): build the model if not built yet and return its
    ``DirectionModel.gives_attention`` (for ``compat.check_direction_capabilities``)."""
    return bool(_direction_model(_state(actor_self, role), _device()).gives_attention)


def direction_path_problem(actor_self: Any, role: Role) -> str | None:
    """Run through ``__ray_call__`` on an actor hosting the direction model: build it if
    not built yet and return why it cannot give the path gradient (``path_problem``), or
    None (for the start-up check of ``datc_mid`` / ``datc_ig``)."""
    return path_problem(_direction_model(_state(actor_self, role), _device()))


def bind_credit_methods(actor_self: Any, role: Role, state: ActorCreditState) -> str:
    """Run through ``__ray_call__``: give a live actor ``role``'s state and signals method.

    Sets ``actor_self._credit_states[role] = state`` and the attribute
    ``signals_method(role)``, a callable taking ``sequences``, ``action_mask``,
    ``attention_mask`` (and ``policy_signals``: what
    ``RayActorGroup.async_run_method_batch`` passes). When the state computes logits signals
    and the actor has a ``forward`` (OpenRLHF's policy actor), that ``forward`` is wrapped by
    ``policy_forward_with_credit``; when it takes the reward gradient on the one-pass path
    (OpenRLHF's reward-model actor), ``forward`` becomes ``reward_forward_with_grad``
    (binding again re-wraps the stock one). One actor may hold both roles. Returns
    "ClassName@pid", where the binding happened.
    """
    states = actor_self.__dict__.setdefault("_credit_states", {})
    states[role] = state
    setattr(actor_self, signals_method(role), functools.partial(credit_signals, actor_self, state))
    stock = actor_self.__dict__.get(_STOCK_FORWARD) or getattr(actor_self, "forward", None)
    if not callable(stock):
        return f"{type(actor_self).__name__}@{os.getpid()}"
    if state.computes & LOGITS_SIGNALS:
        actor_self.__dict__[_STOCK_FORWARD] = stock
        actor_self.forward = functools.partial(policy_forward_with_credit, actor_self, state, stock)
    elif state.one_pass_gradient:
        actor_self.__dict__[_STOCK_FORWARD] = stock
        actor_self.forward = functools.partial(reward_forward_with_grad, actor_self, state, stock)
    return f"{type(actor_self).__name__}@{os.getpid()}"


#: Where ``bind_credit_methods`` keeps the actor's own ``forward`` once it has wrapped it.
_STOCK_FORWARD = "_credit_stock_forward"
