"""Typed containers for what a credit strategy consumes: ``PolicyStats`` and ``CreditBatch``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import InitVar, dataclass
from typing import Literal, get_args

import torch

from credit_core.errors import CreditError
from credit_core.given_rewards import TokenRewards
from credit_core.tensor_checks import check_tensor

Signal = Literal[
    "reward_grad",
    "policy_stats",
    "unsigned_work",
    "token_entropy",
    "reward_attention",
    "prefix_rewards",
    "reward_attribution",
    "implicit_log_ratio",
    "answer_saliency",
]
SIGNALS: frozenset[str] = frozenset(get_args(Signal))
#: The signals that come from a direction model (``policy_stats`` through its embedding
#: table): a strategy reading one of them needs a direction model configured.
DIRECTION_SIGNALS: frozenset[str] = frozenset(
    {
        "reward_grad",
        "policy_stats",
        "unsigned_work",
        "reward_attention",
        "prefix_rewards",
        "reward_attribution",
    }
)
#: The signals read from a second trainable model that the backend hosts, updates every step
#: and checkpoints (PRIME's implicit PRM; ``CreditStrategy.implicit_prm``): only the native
#: trainer hosts one; the plugin backends refuse a strategy reading them at start-up.
TRAINED_MODEL_SIGNALS: frozenset[str] = frozenset({"implicit_log_ratio"})
#: Where a signal comes from: a frozen ``direction`` model (its score, gradient, attention,
#: prefix scores; ``policy_stats`` also needs its embedding table), the ``policy_pass`` over
#: the sampled batch, a second ``trained_model`` the backend hosts (PRIME's implicit PRM),
#: or the policy's own input gradient at the task's ``answer_span`` (OAR-G).
Source = Literal["direction", "policy_pass", "trained_model", "answer_span"]

SOURCES: Mapping[str, Source] = {
    "reward_grad": "direction",
    "reward_attention": "direction",
    "prefix_rewards": "direction",
    "reward_attribution": "direction",
    "policy_stats": "policy_pass",
    "unsigned_work": "policy_pass",
    "token_entropy": "policy_pass",
    "implicit_log_ratio": "trained_model",
    "answer_saliency": "answer_span",
}

#: The per-token (B, T) floating signals, validated alike.
TOKEN_SIGNALS: tuple[str, ...] = (
    "unsigned_work",
    "token_entropy",
    "reward_attention",
    "prefix_rewards",
    "reward_attribution",
    "implicit_log_ratio",
    "answer_saliency",
)

#: ``gather(values)``: a 1-D tensor of this process's values concatenated with those of
#: every other process of the same step (an all-gather over variable lengths), on the
#: values' device. None where one process holds the step's whole batch. Every process calls
#: it once per call of a gathering strategy (``CreditStrategy.gathers``); one without a valid
#: token calls it with an empty float64 tensor (``assign_credit``), so a gather accepts a
#: different floating dtype on each process (e.g. it gathers as float64 and casts back).
Gather = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class PolicyStats:
    """Per-token reductions of the (old) policy's distribution p_t over the vocabulary.

    With p_t = softmax(z_t / temperature) and E the reward model's embedding table (V, d)
    (float32 fields; float64 when computed from float64 inputs):

    - ``p_sampled`` (B, T) float32: p_t[y_t], probability of the sampled token.
    - ``p_sq`` (B, T) float32: q_t = sum_v p_t[v]^2.
    - ``m1`` (B, T, d) float32: p_t^T E.
    - ``m2`` (B, T, d) float32: (p_t^2)^T E.
    - ``sampled_emb`` (B, T, d) float32: E[y_t].

    All five share device and leading shape; construction checks this.
    """

    p_sampled: torch.Tensor
    p_sq: torch.Tensor
    m1: torch.Tensor
    m2: torch.Tensor
    sampled_emb: torch.Tensor

    def __post_init__(self) -> None:
        p = check_tensor("PolicyStats.p_sampled", self.p_sampled, (None, None), floating=True)
        B, T = p.shape
        dev = p.device
        check_tensor("PolicyStats.p_sq", self.p_sq, (B, T), floating=True, device=dev)
        m1 = check_tensor("PolicyStats.m1", self.m1, (B, T, None), floating=True, device=dev)
        d = m1.shape[2]
        check_tensor("PolicyStats.m2", self.m2, (B, T, d), floating=True, device=dev)
        check_tensor(
            "PolicyStats.sampled_emb", self.sampled_emb, (B, T, d), floating=True, device=dev
        )

    @property
    def embed_dim(self) -> int:
        """d, the reward model's embedding width."""
        return int(self.m1.shape[2])

    def select(self, rows: torch.Tensor | slice) -> PolicyStats:
        """The stats of a subset of responses (rows of the batch dimension)."""
        return PolicyStats(
            p_sampled=self.p_sampled[rows],
            p_sq=self.p_sq[rows],
            m1=self.m1[rows],
            m2=self.m2[rows],
            sampled_emb=self.sampled_emb[rows],
        )

    def pad_to(self, length: int) -> PolicyStats:
        """The stats with zeros appended along T up to ``length`` (>= T) positions."""
        T = int(self.p_sampled.shape[1])
        if length < T:
            raise CreditError(f"PolicyStats.pad_to: expected a length >= T={T}, got {length}")
        if length == T:
            return self
        pad = length - T

        def p2(x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.pad(x, (0, pad))

        def p3(x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.pad(x, (0, 0, 0, pad))

        return PolicyStats(
            p2(self.p_sampled), p2(self.p_sq), p3(self.m1), p3(self.m2), p3(self.sampled_emb)
        )

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> PolicyStats:
        """All five tensors on ``device`` (and in floating ``dtype`` if given)."""
        return PolicyStats(
            p_sampled=self.p_sampled.to(device, dtype),
            p_sq=self.p_sq.to(device, dtype),
            m1=self.m1.to(device, dtype),
            m2=self.m2.to(device, dtype),
            sampled_emb=self.sampled_emb.to(device, dtype),
        )

    @staticmethod
    def cat(parts: list[PolicyStats]) -> PolicyStats:
        """Concatenate stats of several batches along the batch dimension."""
        if not parts:
            raise CreditError("PolicyStats.cat: expected at least one PolicyStats, got none")
        return PolicyStats(
            p_sampled=torch.cat([s.p_sampled for s in parts]),
            p_sq=torch.cat([s.p_sq for s in parts]),
            m1=torch.cat([s.m1 for s in parts]),
            m2=torch.cat([s.m2 for s in parts]),
            sampled_emb=torch.cat([s.sampled_emb for s in parts]),
        )


@dataclass(frozen=True)
class CreditBatch:
    """One batch of B responses of (padded) length T, as a strategy sees it.

    - ``advantages`` (B,) floating, finite, B >= 1: the response-level advantage A_i.
    - ``mask`` (B, T) bool: True at the valid response tokens; every row has at least one
      (``empty_rows=True``, init only: rows without one are accepted; ``assign_credit``
      builds such a batch and hands a strategy only its rows with a valid token, ``select``).
    - ``token_ids`` (B, T) int64: the sampled tokens y_t (policy vocabulary).
    - ``reward_grad`` (B, T, d) floating, optional: dR_i / d(RM input embedding at t),
      already moved to policy positions. May hold non-finite values; strategies decide.
    - ``policy_stats`` optional ``PolicyStats`` of shape (B, T[, d]).
    - ``unsigned_work`` (B, T) floating, optional: DATC's W0_t = p_y (u_y - ubar) -
      (S - ubar q), the work without sign(A) (docs/design.md), computed by a backend that
      knew g before the policy statistics (``credit_core.unsigned_work``). Equals
      ``token_work(policy_stats, reward_grad, None)``; may hold non-finite values.
    - ``token_entropy`` (B, T) floating, optional: H_t = -sum_v p_t[v] log p_t[v] of the
      policy that sampled the batch, at the rollout temperature (``token_entropy``).
    - ``reward_attention`` (B, T) floating, optional: alpha_t >= 0, the direction model's
      last-layer attention (head mean) from its score position to response token t,
      renormalized over the response: sums to 1 over a row's valid tokens, or is 0 on the
      whole row when the score position puts no mass on the response.
    - ``prefix_rewards`` (B, T) floating, optional: r_t = s_t - s_{t-1}, s_t the direction
      model's score of the prompt with the response's first t tokens (s_0: empty response).
    - ``reward_attribution`` (B, T) floating, optional: r_t = (e_t - e_null) . g_t, the
      first-order change of the direction model's reward when token t's input embedding e_t
      is replaced by a null embedding (``credit_core.attribution``), from the same gradient
      g as ``reward_grad``; 0 at padding. May hold non-finite values; strategies decide.
    - ``implicit_log_ratio`` (B, T) floating, optional: q_t = log pi_phi(y_t | y_<t) -
      log pi_ref(y_t | y_<t), PRIME's implicit PRM against the reference policy, both at the
      rollout temperature (computed by the backend that hosts and trains pi_phi; see
      ``credit_core.implicit_rewards``).
    - ``answer_saliency`` (B, T) floating, optional: OAR-G's s_t = |dJ/de_t . e_t| >= 0 at
      the reasoning tokens (``reasoning_mask``), 0 elsewhere; J the shift of the policy's
      own answer distribution under noise on the reasoning tokens' input embeddings e_t
      (docs/design.md, "Answer-gradient reweighting (OAR-G)").
    - ``rewards`` (B,) floating, finite, optional: the response rewards R_i behind
      ``advantages`` (context every backend has; read by strategies whose ``reads_groups``).
    - ``groups`` (B,) int64, optional: the group of each response (the responses sampled
      for one prompt share an id; ids are arbitrary, rows of a group need not be adjacent).
    - ``gather`` optional ``Gather``: how a strategy reaches the values of the step's other
      processes (a batch-wide quantile); None: this batch is the whole step.
    - ``answer_mask`` (B, T) bool, optional: the answer span of each response, True at its
      final-answer tokens (a subset of ``mask``; a row may have none), given by the task
      (context, like ``rewards``; read by strategies whose ``reads_answer_span``).
    - ``token_rewards`` optional ``TokenRewards`` (B, T): rewards the user's reward function
      gives at some valid tokens (per token, or at the last token of each step), given, not
      computed (context, like ``rewards``; read by strategies whose ``reads_token_rewards``).

    Everything lives on one device. Construction validates all of it and raises
    ``CreditError`` naming the field with expected and actual shapes.
    """

    advantages: torch.Tensor
    mask: torch.Tensor
    token_ids: torch.Tensor
    reward_grad: torch.Tensor | None = None
    policy_stats: PolicyStats | None = None
    unsigned_work: torch.Tensor | None = None
    token_entropy: torch.Tensor | None = None
    reward_attention: torch.Tensor | None = None
    prefix_rewards: torch.Tensor | None = None
    reward_attribution: torch.Tensor | None = None
    implicit_log_ratio: torch.Tensor | None = None
    rewards: torch.Tensor | None = None
    groups: torch.Tensor | None = None
    gather: Gather | None = None
    answer_saliency: torch.Tensor | None = None
    answer_mask: torch.Tensor | None = None
    token_rewards: TokenRewards | None = None
    empty_rows: InitVar[bool] = False

    def __post_init__(self, empty_rows: bool) -> None:
        adv = check_tensor("CreditBatch.advantages", self.advantages, (None,), floating=True)
        B = adv.shape[0]
        if B == 0:
            raise CreditError("CreditBatch.advantages: expected at least one response, got B=0")
        dev = adv.device
        mask = check_tensor("CreditBatch.mask", self.mask, (B, None), dtype=torch.bool, device=dev)
        T = mask.shape[1]
        check_tensor("CreditBatch.token_ids", self.token_ids, (B, T), dtype=torch.long, device=dev)
        if not bool(torch.isfinite(adv).all()):
            bad = torch.nonzero(~torch.isfinite(adv)).flatten().tolist()
            raise CreditError(f"CreditBatch.advantages: expected finite values, rows {bad} are not")
        empty = torch.nonzero(~mask.any(dim=1)).flatten()
        if empty.numel() > 0 and not empty_rows:
            raise CreditError(
                "CreditBatch.mask: every response needs at least one valid token; "
                f"rows {empty.tolist()} are empty"
            )
        d: int | None = None
        if self.reward_grad is not None:
            g = check_tensor(
                "CreditBatch.reward_grad", self.reward_grad, (B, T, None), floating=True, device=dev
            )
            d = g.shape[2]
        if self.policy_stats is not None:
            ps = self.policy_stats
            if not isinstance(ps, PolicyStats):
                raise CreditError(
                    f"CreditBatch.policy_stats: expected PolicyStats, got {type(ps).__name__}"
                )
            check_tensor("CreditBatch.policy_stats.p_sampled", ps.p_sampled, (B, T), device=dev)
            if d is not None and ps.embed_dim != d:
                raise CreditError(
                    f"CreditBatch.policy_stats.m1: expected embedding width d={d} "
                    f"(from reward_grad), got {ps.embed_dim}"
                )
        for name in TOKEN_SIGNALS:
            value = getattr(self, name)
            if value is not None:
                check_tensor(f"CreditBatch.{name}", value, (B, T), floating=True, device=dev)
        if self.rewards is not None:
            r = check_tensor("CreditBatch.rewards", self.rewards, (B,), floating=True, device=dev)
            if not bool(torch.isfinite(r).all()):
                bad = torch.nonzero(~torch.isfinite(r)).flatten().tolist()
                raise CreditError(
                    f"CreditBatch.rewards: expected finite values, rows {bad} are not"
                )
        if self.groups is not None:
            check_tensor("CreditBatch.groups", self.groups, (B,), dtype=torch.long, device=dev)
        if self.answer_mask is not None:
            span = check_tensor(
                "CreditBatch.answer_mask", self.answer_mask, (B, T), dtype=torch.bool, device=dev
            )
            outside = torch.nonzero((span & ~mask).any(dim=1)).flatten()
            if outside.numel() > 0:
                raise CreditError(
                    "CreditBatch.answer_mask: expected answer tokens among the valid tokens "
                    f"(mask); rows {outside.tolist()} mark padding"
                )
        if self.token_rewards is not None:
            _check_token_rewards(self.token_rewards, mask)

    def select(self, rows: torch.Tensor) -> CreditBatch:
        """The batch of the responses ``rows`` ((B,) bool or 1-D int64 indices) picks, with
        the same ``gather``, validated as any batch (every row needs a valid token)."""

        def pick(value: torch.Tensor | None) -> torch.Tensor | None:
            return None if value is None else value[rows]

        return CreditBatch(
            advantages=self.advantages[rows],
            mask=self.mask[rows],
            token_ids=self.token_ids[rows],
            reward_grad=pick(self.reward_grad),
            policy_stats=None if self.policy_stats is None else self.policy_stats.select(rows),
            unsigned_work=pick(self.unsigned_work),
            token_entropy=pick(self.token_entropy),
            reward_attention=pick(self.reward_attention),
            prefix_rewards=pick(self.prefix_rewards),
            reward_attribution=pick(self.reward_attribution),
            implicit_log_ratio=pick(self.implicit_log_ratio),
            rewards=pick(self.rewards),
            groups=pick(self.groups),
            gather=self.gather,
            answer_saliency=pick(self.answer_saliency),
            answer_mask=pick(self.answer_mask),
            token_rewards=None if self.token_rewards is None else self.token_rewards.select(rows),
        )

    @property
    def batch_size(self) -> int:
        return int(self.mask.shape[0])

    @property
    def lengths(self) -> torch.Tensor:
        """(B,) int64 number of valid tokens per response."""
        return self.mask.sum(dim=1)

    def gathered(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` (1-D) joined with the other processes' (``gather``), or as they are."""
        return values if self.gather is None else self.gather(values)

    def require_groups(self, strategy: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(rewards (B,), groups (B,)) of the batch; CreditError naming the missing one."""
        for name in ("rewards", "groups"):
            if getattr(self, name) is None:
                raise CreditError(
                    f"strategy '{strategy}' reads the response rewards and their groups, but "
                    f"CreditBatch.{name} is None (pass rewards= and groups= to assign_credit)"
                )
        assert self.rewards is not None and self.groups is not None
        return self.rewards, self.groups

    def require_answer_span(self, strategy: str) -> torch.Tensor:
        """``answer_mask`` (B, T) of the batch; CreditError naming it when it is None."""
        if self.answer_mask is None:
            raise CreditError(
                f"strategy '{strategy}' reads each response's answer span, but "
                "CreditBatch.answer_mask is None (the task declares no answer span: pass "
                "answer_mask= to assign_credit; the native trainer takes it from "
                "data.answer_span)"
            )
        return self.answer_mask

    def require_token_rewards(self, strategy: str) -> TokenRewards:
        """``token_rewards`` of the batch; CreditError naming it when it is None."""
        if self.token_rewards is None:
            raise CreditError(
                f"strategy '{strategy}' reads the token rewards the reward function gives, but "
                "CreditBatch.token_rewards is None (pass CreditSignals(token_rewards=...) to "
                "assign_credit; the reward function returned one number per response)"
            )
        return self.token_rewards

    def require(self, signals: frozenset[str], strategy: str) -> None:
        """Raise CreditError if a signal in ``signals`` is missing from this batch."""
        for signal in sorted(signals):
            if getattr(self, signal) is None:
                raise CreditError(
                    f"strategy '{strategy}' requires signal '{signal}', "
                    f"but CreditBatch.{signal} is None"
                )


def _check_token_rewards(token_rewards: object, mask: torch.Tensor) -> None:
    """``token_rewards`` is a ``TokenRewards`` of ``mask``'s (B, T) shape and device, given
    at valid tokens only; ``CreditError`` naming ``CreditBatch.token_rewards``."""
    if not isinstance(token_rewards, TokenRewards):
        raise CreditError(
            f"CreditBatch.token_rewards: expected TokenRewards, got {type(token_rewards).__name__}"
        )
    check_tensor(
        "CreditBatch.token_rewards.values",
        token_rewards.values,
        tuple(mask.shape),
        device=mask.device,
    )
    outside = torch.nonzero((token_rewards.given & ~mask).any(dim=1)).flatten()
    if outside.numel() > 0:
        raise CreditError(
            "CreditBatch.token_rewards.given: expected rewards at valid tokens only (mask); "
            f"rows {outside.tolist()} give one at padding"
        )
