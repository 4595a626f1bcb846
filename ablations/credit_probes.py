"""Credit-quality probes: how good is a strategy's token credit at the current policy?

docs/design.md, "When token credit pays off". At every evaluation of an ablation run, on a
fresh batch of held-out prompts sampled by the trainer's own rollout
(``GRPORecipe.rollout``) and credited by its own credit path (``GRPORecipe.signals``):

- ``probe/credit_corr``: the within-response Pearson correlation of the token advantages
  A_t with the exact token credit c_t, averaged over the responses where both vary. For a
  score that is a sum of per-token values, r(y) = sum_t V_t[y_t] (a ``TokenRule``), the
  exact credit of the sampled token is c_t = V_t[y_t] - sum_v p_t[v] V_t[v]: what token y_t
  adds against the policy's average at t. Target tokens: (1[target] - P_t(target)) / 8;
  positional: f(E[y_t]) - E_p f at the scored positions. Settings without a rule (the MiniLM
  similarity) get none. Uniform credit is constant within a response: no correlation (NaN).
- ``probe/grad_cos``: the cosine between the batch policy gradient of the strategy's token
  advantages, (1/B) sum_i sum_t A_t grad log p(y_t), and a high-sample estimate of the
  true gradient of the exact metric J = E[m(y)]: REINFORCE with a leave-one-out group
  baseline over ``metric_samples`` fresh samples, drawn as two independent halves.
- ``probe/grad_split_half``: the cosine between the two halves' estimates, the estimate's
  split-half reliability (near 1: the true gradient is well estimated; the cosine of the
  full estimate with the truth is then about sqrt of the Spearman-Brown value).
- ``probe/metric``: the mean exact metric over those samples (an on-policy estimate of the
  held-out metric at every evaluation).
- ``probe/credit_corr@<label>`` (``compare``): the credit correlation of another credit
  (a strategy of the ablation, with its gradient path) on the same probe batch, computed by
  the same ``GRPORecipe.signals`` with that strategy and reward side for the call
  (``strategy=``, ``rewards=``): different credits judged at the same policy and samples
  (e.g. DATC's credit along uniform's trajectory).
- ``probe/oracle_credit_corr`` (with ``oracle_k > 0``, settings with a rule): the same
  correlation for the oracle credit of the probe batch: DATC's work with the direction
  model's exact swap differences over the sampled and top-k tokens
  (``ablations.swap.swap_work``, ``ablations.swap.swap_deltas``; B x T x k RM forwards),
  allocated by the shared rule with ``oracle_beta``/``oracle_lam``: the upper bound of what
  a better direction could give, whatever the run's strategy.

The probes never change the run: rollouts use seeds of their own tags, and a strategy's
mutable state (``datc_shuffled``'s random stream) is restored after it credits a probe
batch. Policy gradients are taken with ``torch.autograd.grad`` (no ``.grad`` is touched).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from pydantic import BaseModel, ConfigDict, Field

from ablations.sparse_tasks import TokenRule
from ablations.swap import swap_deltas, swap_work
from adapters.direction import DirectionModel
from adapters.policy import final_hidden_states, lm_head_of, predictor_positions
from adapters.policy import response_logprobs_and_stats as logprobs_and_stats
from adapters.scorers import decode_rows
from backends.common.data import Prompt
from backends.torch.compare import CompareCredit
from backends.torch.rollout import RolloutBatch
from credit_core import allocate_weights

if TYPE_CHECKING:
    from backends.torch.trainer import GRPORecipe

#: (prompts, responses) -> exact metric per response.
TextMetric = Callable[[list[str], list[str]], Sequence[float]]


class ProbeConfig(BaseModel):
    """How the credit-quality probes are computed (``probes`` of an ablation config)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    prompts: int = Field(default=8, ge=1, description="held-out prompts of the probe batch")
    group_size: int | None = Field(
        default=None, ge=2, description="samples per prompt in the probe batch (default: G)"
    )
    metric_samples: int = Field(
        default=32,
        ge=4,
        description="samples per prompt for the true-gradient estimate (two halves)",
    )
    oracle_k: int = Field(
        default=0, ge=0, description="exact-swap oracle: top-k tokens per position (0: off)"
    )
    oracle_beta: float = Field(default=0.5, gt=0.0)
    oracle_lam: float = Field(default=0.5, ge=0.0, le=1.0)
    compare: list[str] = Field(
        default_factory=list,
        description="labels of strategies whose credit is also probed on every run's batch",
    )


@dataclass(frozen=True)
class ProbeResult:
    """One evaluation's probe values (NaN where undefined)."""

    credit_corr: float
    grad_cos: float
    grad_split_half: float
    metric: float
    oracle_credit_corr: float = float("nan")
    compared: dict[str, float] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        return {
            "probe/credit_corr": self.credit_corr,
            "probe/grad_cos": self.grad_cos,
            "probe/grad_split_half": self.grad_split_half,
            "probe/metric": self.metric,
            "probe/oracle_credit_corr": self.oracle_credit_corr,
            **{f"probe/credit_corr@{k}": v for k, v in self.compared.items()},
        }


# ------------------------------------------------------------------------ pure math


def exact_token_credit(
    values: torch.Tensor, probs: torch.Tensor, token_ids: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """c_t = V_t[y_t] - sum_v p_t[v] V_t[v] (B, T) float64, 0 at padding.

    values, probs (B, T, V); token_ids (B, T) int; mask (B, T) bool.
    """
    v = values.to(torch.float64)
    picked = v.gather(2, token_ids.clamp(min=0).long().unsqueeze(2)).squeeze(2)
    expected = (probs.to(torch.float64) * v).sum(dim=2)
    return torch.where(mask, picked - expected, 0.0)


def within_response_corr(a: torch.Tensor, c: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean over responses of the Pearson correlation of a and c (B, T) over the valid
    tokens; responses where either is constant (or with < 2 tokens) are left out; NaN if
    none is left."""
    corrs = []
    for row_a, row_c, m in zip(a.double(), c.double(), mask, strict=True):
        x, y = row_a[m], row_c[m]
        if x.numel() < 2:
            continue
        dx, dy = x - x.mean(), y - y.mean()
        nx, ny = float(dx.norm()), float(dy.norm())
        scale = max(float(x.abs().max()), 1e-30), max(float(y.abs().max()), 1e-30)
        if nx <= 1e-9 * scale[0] or ny <= 1e-9 * scale[1]:
            continue
        corrs.append(float((dx * dy).sum()) / (nx * ny))
    return math.fsum(corrs) / len(corrs) if corrs else float("nan")


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """cos(a, b) of two flat vectors; NaN if either is 0."""
    na, nb = float(a.double().norm()), float(b.double().norm())
    if na == 0.0 or nb == 0.0:
        return float("nan")
    return float((a.double() * b.double()).sum()) / (na * nb)


def leave_one_out(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """r_i minus the mean of the other G - 1 scores of its group (B,) float64."""
    r = scores.double().view(-1, group_size)
    total = r.sum(dim=1, keepdim=True)
    return (r - (total - r) / (group_size - 1)).flatten()


def flat_policy_gradient(
    logp: torch.Tensor,
    token_advantages: torch.Tensor,
    mask: torch.Tensor,
    params: Sequence[torch.Tensor],
) -> torch.Tensor:
    """(1/B) sum_i sum_t A_t grad log p(y_t), flattened over ``params`` (float64).

    logp (B, T) differentiable in ``params``; token_advantages (B, T); mask (B, T) bool.
    """
    B = logp.shape[0]
    objective = (torch.where(mask, token_advantages.to(logp.dtype) * logp, 0.0)).sum() / B
    grads = torch.autograd.grad(objective, list(params), allow_unused=True)
    return torch.cat(
        [
            (g if g is not None else torch.zeros_like(p)).flatten().double()
            for g, p in zip(grads, params, strict=True)
        ]
    )


# --------------------------------------------------------------- through the trainer


def _rollout(recipe: GRPORecipe, prompts: Sequence[Prompt], g: int, tag: str) -> RolloutBatch:
    index = list(range(len(prompts)))
    return recipe.rollout(prompts, index, index, group_size=g, greedy=False, tag=tag)


def _params(recipe: GRPORecipe) -> list[torch.Tensor]:
    return [p for p in recipe.model.parameters() if p.requires_grad]


def _logp(recipe: GRPORecipe, batch: RolloutBatch) -> torch.Tensor:
    logp, _ = logprobs_and_stats(
        recipe.model,
        batch.input_ids,
        batch.attention_mask,
        batch.response_len,
        temperature=recipe.cfg.rollout.temperature,
    )
    return logp


@torch.no_grad()
def token_distributions(recipe: GRPORecipe, batch: RolloutBatch) -> torch.Tensor:
    """p_t (B, R, V) float64 at the rollout temperature: the full next-token distribution
    at every response position (materialized: for the small vocabularies of the probed
    settings only)."""
    weight, bias = lm_head_of(recipe.model)
    hidden = final_hidden_states(recipe.model, batch.input_ids, batch.attention_mask)
    where = predictor_positions(batch.attention_mask, batch.response_len)
    h = hidden.gather(1, where.unsqueeze(2).expand(*where.shape, hidden.shape[2]))
    logits = h.double() @ weight.double().T
    if bias is not None:
        logits = logits + bias.double()
    return torch.softmax(logits / recipe.cfg.rollout.temperature, dim=2)


def _metric_scores(
    recipe: GRPORecipe, batch: RolloutBatch, pool: Sequence[Prompt], metric: TextMetric | None
) -> torch.Tensor:
    if metric is None:
        labels = [pool[g].label for g in batch.group.tolist()]
        return recipe.reward.compute(
            batch,
            with_grad=False,
            micro_batch_size=recipe.cfg.algorithm.micro_batch_size,
            labels=labels,
        ).rewards.double()
    tok = recipe.policy.tokenizer
    prompts = decode_rows(tok, batch.prompt_ids, batch.prompt_mask)
    responses = decode_rows(tok, batch.response_ids, batch.response_mask)
    return torch.tensor([float(x) for x in metric(prompts, responses)], dtype=torch.float64)


def metric_gradient_halves(
    recipe: GRPORecipe, prompts: Sequence[Prompt], metric: TextMetric | None, samples: int
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Two independent REINFORCE estimates of grad E[m] (leave-one-out baseline, each from
    ``samples // 2`` samples per prompt) and the mean metric over all samples."""
    half = max(2, samples // 2)
    grads, means = [], []
    for part in ("a", "b"):
        batch = _rollout(recipe, prompts, half, f"ablate_probe_metric_{part}")
        scores = _metric_scores(recipe, batch, prompts, metric)
        adv = leave_one_out(scores, half).unsqueeze(1).expand_as(batch.response_mask)
        grads.append(
            flat_policy_gradient(_logp(recipe, batch), adv, batch.response_mask, _params(recipe))
        )
        means.append(float(scores.mean()))
    return grads[0], grads[1], sum(means) / len(means)


def oracle_token_advantages(
    direction: DirectionModel,
    batch: RolloutBatch,
    probs: torch.Tensor,
    advantages: torch.Tensor,
    cfg: ProbeConfig,
) -> torch.Tensor:
    """A_t of the exact-swap oracle (B, R): A * w with w from ``swap_work`` scores."""
    k = min(cfg.oracle_k, probs.shape[2] - 1)
    swaps = swap_deltas(
        direction,
        batch.prompt_ids,
        batch.prompt_mask,
        batch.response_ids,
        batch.response_mask,
        probs,
        k,
    )
    scores = swap_work(swaps.probs, swaps.deltas, advantages)
    w, _ = allocate_weights(
        scores, batch.response_mask, beta=cfg.oracle_beta, lam=cfg.oracle_lam, on_nonfinite="error"
    )
    return advantages.to(w.dtype).unsqueeze(1) * w


def probe(
    recipe: GRPORecipe,
    cfg: ProbeConfig,
    rule: TokenRule | None,
    metric: TextMetric | None,
    compare: Sequence[CompareCredit] = (),
) -> ProbeResult:
    """The probes of ``recipe``'s strategy at its current policy (see the module doc).

    ``rule``: the setting's exact per-token decomposition (None: no credit correlation);
    ``metric``: the exact text metric (None: the run's own reward is the metric);
    ``compare``: other credits whose correlation is measured on the same batch.
    """
    prompts = recipe.eval_prompts[: cfg.prompts]
    if not prompts:
        nan = float("nan")
        return ProbeResult(nan, nan, nan, nan)
    g = cfg.group_size or recipe.cfg.rollout.group_size
    batch = _rollout(recipe, prompts, g, "ablate_probe")
    state = recipe.credit.strategy.state_dict()
    signals = recipe.signals(batch, prompts)
    recipe.credit.strategy.load_state_dict(state)
    token_adv = signals.token_advantages
    mask = batch.response_mask
    corr = oracle = float("nan")
    compared: dict[str, float] = {}
    if rule is not None:
        probs = token_distributions(recipe, batch)
        prompt_texts = [p.text for p in (prompts[i] for i in batch.group.tolist())]
        values = rule.values(prompt_texts, batch.response_ids, probs.shape[2])
        credit = exact_token_credit(values, probs, batch.response_ids, mask)
        corr = within_response_corr(token_adv, credit, mask)
        for other in compare:
            theirs = recipe.signals(
                batch, prompts, strategy=other.strategy, rewards=other.reward
            ).token_advantages
            compared[other.label] = within_response_corr(theirs, credit, mask)
        direction = recipe.reward.direction
        if cfg.oracle_k > 0 and direction is not None:
            oracle_adv = oracle_token_advantages(direction, batch, probs, signals.advantages, cfg)
            oracle = within_response_corr(oracle_adv, credit, mask)
    g_strategy = flat_policy_gradient(_logp(recipe, batch), token_adv, mask, _params(recipe))
    g_a, g_b, metric_mean = metric_gradient_halves(recipe, prompts, metric, cfg.metric_samples)
    return ProbeResult(
        credit_corr=corr,
        grad_cos=cosine(g_strategy, g_a + g_b),
        grad_split_half=cosine(g_a, g_b),
        metric=metric_mean,
        oracle_credit_corr=oracle,
        compared=compared,
    )
