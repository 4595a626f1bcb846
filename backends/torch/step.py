"""What the phases of one GRPO step hand to each other, and the metrics each one reports.

``GRPORecipe.train_step`` is rollout -> ``StepSignals`` -> ``UpdateResult``, timed by
``PhaseClock`` into ``StepTiming``. Every phase result reduces its own metrics over the
ranks (``metrics``): sums with ``all_reduce_sum``, extremes with ``all_reduce_max``,
per-response values gathered (``DistContext``); each rank gets the same, global, figures.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from time import perf_counter
from typing import Any

import torch

from backends.common.credit import AgreementMetrics
from backends.torch.distributed import DistContext
from backends.torch.rollout import RolloutBatch
from credit_core import CreditDiagnostics, CreditResult


@dataclass(frozen=True)
class StepSignals:
    """The credit phase's output for this rank's responses: everything the update needs.

    - ``batch``: the rollout (B responses, R response columns).
    - ``rewards`` (B,) float32, ``advantages`` (B,) float32: A from ``group_advantages``.
    - ``old_logp`` (B, R): no-grad log-probs of the sampled tokens at the rollout temperature.
    - ``ref_logp`` (B, R) or None: the reference policy's, when the KL term is on or the
      strategy reads the implicit PRM's log ratio against it (PRIME).
    - ``credit``: the strategy's token advantages (B, R) float32 (0 at padding) and its
      ``CreditDiagnostics``.
    - ``kl_ref`` (B, R) or None: the KL estimate of old against reference policy.
    - ``reward_diagnostics``: the reward adapters' counters (``rm/...``, ``bridge/...``),
      averaged over this rank's micro-batches.
    - ``reward_grad_rows`` / ``policy_stats_rows``: responses whose reward gradient / old
      policy statistics (as ``PolicyStats``, or streamed into DATC's W0) were computed; 0
      when the strategy reads neither.
    - ``reward_seconds``: this rank's wall time of the reward-model side of the phase (the
      rewards and every reward-side signal: gradient, attention, prefix rewards), a part of
      the phase's time.
    - ``values`` and ``returns`` (B, R) float32, 0 at padding, or None: with
      ``algorithm.estimator: gae``, the critic's no-grad values of this batch and the GAE
      returns it regresses on (``backends.torch.gae``); ``advantages`` is then the whitened
      GAE advantage of each response's first token (its advantage against the critic's
      value of the prompt), and ``credit``'s token advantages are the whitened GAE ones.
    - ``agreement``: the direction model's agreement with the reward on the whole step and
      the gate's state (``CreditRun.apply``), for a strategy that reads a direction model;
      None otherwise.
    """

    batch: RolloutBatch
    rewards: torch.Tensor
    advantages: torch.Tensor
    old_logp: torch.Tensor
    ref_logp: torch.Tensor | None
    credit: CreditResult
    kl_ref: torch.Tensor | None
    reward_diagnostics: dict[str, float]
    reward_grad_rows: int
    policy_stats_rows: int
    reward_seconds: float
    values: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    agreement: AgreementMetrics | None = None

    @property
    def token_advantages(self) -> torch.Tensor:
        """(B, R) float32, 0 at padding."""
        return self.credit.token_advantages

    def metrics(self, ctx: DistContext, eos_ids: list[int]) -> dict[str, float]:
        """Rewards, advantages, response lengths, entropy, KL and credit of the whole step."""
        batch, mask = self.batch, self.batch.response_mask
        rewards = ctx.all_gather_cat(self.rewards.float())
        advantages = ctx.all_gather_cat(self.advantages.float())
        lengths = mask.sum(dim=1)
        ended = torch.isin(batch.response_ids, torch.tensor(eos_ids, device=lengths.device))
        truncated = ~(ended & mask).any(dim=1)
        diag_keys = sorted(self.reward_diagnostics)
        local = torch.tensor(
            [
                float(lengths.sum()),
                float(truncated.sum()),
                float(-(self.old_logp * mask).sum()),
                float((self.kl_ref * mask).sum()) if self.kl_ref is not None else 0.0,
                float(self.reward_grad_rows),
                float(self.policy_stats_rows),
                *(self.reward_diagnostics[k] / ctx.world_size for k in diag_keys),
            ],
            dtype=torch.float64,
            device=ctx.collective_device,
        )
        tokens, n_truncated, nll, kl, grad_rows, stats_rows, *diag = (
            float(x) for x in ctx.all_reduce_sum(local)
        )
        n_resp = float(rewards.numel())
        out = {
            "reward/mean": float(rewards.mean()),
            "reward/std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
            "reward/min": float(rewards.min()),
            "reward/max": float(rewards.max()),
            "advantage/abs_mean": float(advantages.abs().mean()),
            "response/length_mean": tokens / n_resp,
            "response/truncated_frac": n_truncated / n_resp,
            "policy/entropy": nll / tokens,
            "signals/reward_grad_rows": grad_rows,
            "signals/policy_stats_rows": stats_rows,
            **dict(zip(diag_keys, diag, strict=True)),
        }
        if self.kl_ref is not None:
            out["kl/ref"] = kl / tokens
        if self.values is not None and self.returns is not None:
            out.update(self._critic_metrics(ctx, tokens))
        out.update(self._credit_metrics(ctx, float(lengths.sum())))
        if self.agreement is not None:  # already the whole step's
            out.update(self.agreement.to_dict(prefix="credit/"))
        return out

    def _critic_metrics(self, ctx: DistContext, n_tok: float) -> dict[str, float]:
        """Token means of the critic's values and of the GAE returns, and the fraction of
        the returns' variance the values explain, over the whole step."""
        assert self.values is not None and self.returns is not None
        m = self.batch.response_mask
        v, r = self.values.double() * m, self.returns.double() * m
        sums = ctx.all_reduce_sum(
            torch.stack([v.sum(), r.sum(), (r * r).sum(), ((r - v) ** 2).sum()]).to(
                ctx.collective_device
            )
        )
        v_sum, r_sum, r_sq, err_sq = (float(x) for x in sums)
        r_var = r_sq / n_tok - (r_sum / n_tok) ** 2
        return {
            "critic/value_mean": v_sum / n_tok,
            "critic/return_mean": r_sum / n_tok,
            "critic/explained_var": 1.0 - err_sq / n_tok / r_var if r_var > 0 else float("nan"),
        }

    def _credit_metrics(self, ctx: DistContext, n_tok: float) -> dict[str, float]:
        """``CreditDiagnostics`` of the whole step: each rank's summary combined exactly
        (max, min, response-weighted entropy, token-weighted fraction, summed fallbacks)."""
        diag, n_resp = self.credit.diagnostics, self.batch.size
        extremes = ctx.all_reduce_max(
            torch.tensor(
                [diag.weight_max, -diag.weight_min],
                dtype=torch.float64,
                device=ctx.collective_device,
            )
        )
        sums = ctx.all_reduce_sum(
            torch.tensor(
                [
                    diag.weight_entropy * n_resp,
                    n_resp,
                    diag.frac_upweighted * n_tok,
                    n_tok,
                    diag.nonfinite_fallbacks,
                    diag.uniform_fallbacks,
                ],
                dtype=torch.float64,
                device=ctx.collective_device,
            )
        )
        merged = CreditDiagnostics(
            weight_max=float(extremes[0]),
            weight_min=-float(extremes[1]),
            weight_entropy=float(sums[0] / sums[1]),
            frac_upweighted=float(sums[2] / sums[3]),
            nonfinite_fallbacks=int(sums[4]),
            uniform_fallbacks=int(sums[5]),
        )
        return merged.to_dict(prefix="credit/")


@dataclass(frozen=True)
class UpdateTerms:
    """One micro-step's loss terms and token counts (this rank); they add up over a step.

    ``policy_loss``, ``kl_loss`` and the critic's ``value_loss`` (0 without a critic) are
    already divided by the update's global normalizer, so their sum over micro-steps and
    ranks is the update's loss.
    """

    policy_loss: float = 0.0
    kl_loss: float = 0.0
    clipped_tokens: float = 0.0
    tokens: float = 0.0
    neg_log_ratio: float = 0.0
    value_loss: float = 0.0
    value_clipped_tokens: float = 0.0

    def __add__(self, other: UpdateTerms) -> UpdateTerms:
        return UpdateTerms(
            *(getattr(self, f.name) + getattr(other, f.name) for f in fields(UpdateTerms))
        )

    def reduced(self, ctx: DistContext) -> UpdateTerms:
        """The sum over ranks."""
        local = torch.tensor(
            [getattr(self, f.name) for f in fields(UpdateTerms)],
            dtype=torch.float64,
            device=ctx.collective_device,
        )
        return UpdateTerms(*ctx.all_reduce_sum(local).tolist())


@dataclass(frozen=True)
class UpdateResult:
    """The update phase: its terms summed over all optimizer updates, this rank's summed
    gradient norms (identical on every rank), the number of updates and the learning rate
    they used; with a critic (``algorithm.estimator: gae``) its summed gradient norms and
    learning rate too (None without one)."""

    terms: UpdateTerms
    grad_norm_sum: float
    n_updates: int
    lr: float
    critic_grad_norm_sum: float | None = None
    critic_lr: float | None = None

    def metrics(self, ctx: DistContext, kl_coef: float) -> dict[str, float]:
        g, n = self.terms.reduced(ctx), self.n_updates
        out = {
            "loss/policy": g.policy_loss / n,
            "loss/kl": g.kl_loss / n,
            "loss/total": (g.policy_loss + kl_coef * g.kl_loss) / n,
            "ppo/clip_frac": g.clipped_tokens / g.tokens,
            "ppo/approx_kl": g.neg_log_ratio / g.tokens,
            "optim/grad_norm": self.grad_norm_sum / n,
            "optim/lr": self.lr,
        }
        if self.critic_grad_norm_sum is not None and self.critic_lr is not None:
            out.update(
                {
                    "loss/value": g.value_loss / n,
                    "critic/clip_frac": g.value_clipped_tokens / g.tokens,
                    "critic/grad_norm": self.critic_grad_norm_sum / n,
                    "critic/lr": self.critic_lr,
                }
            )
        return out


class PhaseClock:
    """Seconds of consecutive phases on this rank (``lap``). On a CUDA ``device`` every
    boundary first waits for the work queued on it, so the GPU time of a phase is billed to
    that phase (kernels run asynchronously: without the wait, the next phase's first sync
    would pay for them)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._sync()
        self._last = perf_counter()

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def lap(self) -> float:
        """Seconds since the previous lap (or the clock's start)."""
        self._sync()
        now = perf_counter()
        elapsed, self._last = now - self._last, now
        return elapsed


@dataclass(frozen=True)
class StepTiming:
    """Seconds of each phase on this rank, and its response tokens. ``signals_reward`` is
    the reward-model side's part of ``signals`` (``StepSignals.reward_seconds``)."""

    rollout: float
    signals: float
    signals_reward: float
    update: float
    tokens: float

    def metrics(self, ctx: DistContext) -> dict[str, float]:
        """Phase times (the slowest rank's) and response tokens per second of the step."""
        total = self.rollout + self.signals + self.update
        dev = ctx.collective_device
        local = torch.tensor(
            [self.rollout, self.signals, self.signals_reward, self.update, total],
            dtype=torch.float64,
            device=dev,
        )
        rollout, signals, reward, update, slowest = ctx.all_reduce_max(local).tolist()
        tokens = float(
            ctx.all_reduce_sum(torch.tensor([self.tokens], dtype=torch.float64, device=dev))[0]
        )
        return {
            "time/rollout": rollout,
            "time/signals": signals,
            "time/signals_reward": reward,
            "time/update": update,
            "time/step": slowest,
            "throughput/tokens_per_s": tokens / slowest,
        }


def merged(*parts: dict[str, float]) -> dict[str, Any]:
    """One metrics record from the phases' (disjoint) records."""
    out: dict[str, Any] = {}
    for part in parts:
        clash = out.keys() & part.keys()
        if clash:
            raise ValueError(f"step metrics: two phases report {sorted(clash)}")
        out.update(part)
    return out
