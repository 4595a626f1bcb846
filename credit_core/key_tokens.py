"""KTAE: key-token advantages from the group's outcome statistics (Sun et al., 2025, "KTAE: A
Model-Free Algorithm to Key-Tokens Advantage Estimation in Mathematical Reasoning", arXiv
2505.16826; docs/design.md, "Key tokens (KTAE)").

Within each group (the responses of one prompt) a response is *correct* when its reward
exceeds ``threshold`` (0: the authors' ``rewards > 0``). For every token id v that occurs in
the group, the 2 x 2 contingency table counts responses, not occurrences:

    a = correct responses containing v       b = incorrect responses containing v
    c = N_c - a                              d = N_w - b

and scores the association of v with correctness by Fisher's exact test (two-sided p,
F = exp(-2 p), 0 where p = 1) and by the information gain IG = H(Y) - H(Y | X) in bits of
the outcome Y given presence X. Its direction is Cohen's h between the shares of correct and
incorrect responses containing v, h = asin(sqrt(a / N_c)) - asin(sqrt(b / N_w)), plus (``tf``)
a BM25-saturated frequency contrast tf_c / (tf_w + 1e-5) - tf_w / (tf_c + 1e-5). The key-token
score

    k_v = scale * (2 sigmoid(s_v) - 1),   s_v = (alpha F_v + beta IG_v) x_v / (alpha + beta)

is added to the response advantage: A_t = A_i + k_{y_t} at every valid token t. A group
without both a correct and an incorrect response gives k = 0 (A_t = A_i).

Everything is counted at once over the batch: (group, token id) pairs are keyed
g V + v and counted with ``torch.unique`` and ``index_add_``; no Python loop over tokens or
groups. The Fisher p-value is the hypergeometric tail in float64 through ``lgamma``,
vectorised over the tables (a grid of at most ``max group size + 1`` outcomes per table).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from credit_core.allocation import weight_diagnostics
from credit_core.batch import CreditBatch
from credit_core.errors import CreditError
from credit_core.strategy import CreditResult, CreditStrategy, CriticRewardForm, builtin

#: A two-sided p-value at or above 1 - this counts as p = 1 (the observed table is a most
#: probable one: no association, F = 0); the authors test p != 1.0 in float32.
P_ONE_TOLERANCE = 1e-9
#: Tables whose probability is within this relative margin of the observed one count as
#: "as extreme" in the two-sided sum (R's ``fisher.test`` margin, 1 + 1e-7).
RELATIVE_TIE = 1e-7
#: The floor in the denominators of the frequency contrast (the authors' 1e-5).
TF_FLOOR = 1e-5


def _log_comb(n: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return torch.lgamma(n + 1) - torch.lgamma(k + 1) - torch.lgamma(n - k + 1)


def fisher_exact_two_sided(
    a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor
) -> torch.Tensor:
    """Two-sided p-values (N,) float64 of Fisher's exact test of the tables [[a, b], [c, d]]
    (four (N,) tensors of non-negative integer counts): the sum of the hypergeometric
    probabilities P(k) (margins fixed) of the tables with P(k) <= P(a) (1 + ``RELATIVE_TIE``),
    as ``scipy.stats.fisher_exact``. One (N, max min(a + b, a + c) + 1) grid, no loop."""
    a, b, c, d = (x.to(torch.float64) for x in (a, b, c, d))
    row1, col1 = a + b, a + c
    n = row1 + c + d
    k_min = (row1 + col1 - n).clamp_min(0.0)
    k_max = torch.minimum(row1, col1)
    width = int(k_max.max()) + 1 if k_max.numel() else 1
    k = torch.arange(width, dtype=torch.float64, device=a.device).unsqueeze(0)
    inside = (k >= k_min.unsqueeze(1)) & (k <= k_max.unsqueeze(1))
    ks = torch.where(inside, k, k_min.unsqueeze(1))

    def log_p(
        x: torch.Tensor, r1: torch.Tensor, c1: torch.Tensor, nn: torch.Tensor
    ) -> torch.Tensor:
        return _log_comb(c1, x) + _log_comb(nn - c1, r1 - x) - _log_comb(nn, r1)

    grid = log_p(ks, row1.unsqueeze(1), col1.unsqueeze(1), n.unsqueeze(1))
    observed = log_p(a, row1, col1, n).unsqueeze(1)
    extreme = inside & (grid <= observed + torch.log1p(torch.tensor(RELATIVE_TIE)))
    p = torch.where(extreme, grid.exp(), 0.0).sum(dim=1)
    return p.clamp(max=1.0)


def _plogp(p: torch.Tensor) -> torch.Tensor:
    return torch.where(p > 0, -p * torch.log2(torch.where(p > 0, p, 1.0)), 0.0)


def _binary_entropy(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    total = x + y
    safe = torch.where(total > 0, total, 1.0)
    return torch.where(total > 0, _plogp(x / safe) + _plogp(y / safe), 0.0)


def information_gain(
    a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor
) -> torch.Tensor:
    """IG (N,) float64 in bits of the column (correct/incorrect) given the row (present /
    absent) of the tables [[a, b], [c, d]]: H(a + c, b + d) - sum_rows (row / n) H(row);
    0 for an empty table."""
    a, b, c, d = (x.to(torch.float64) for x in (a, b, c, d))
    n = a + b + c + d
    safe = torch.where(n > 0, n, 1.0)
    h_y = _binary_entropy(a + c, b + d)
    h_y_x = ((a + b) / safe) * _binary_entropy(a, b) + ((c + d) / safe) * _binary_entropy(c, d)
    return torch.where(n > 0, h_y - h_y_x, 0.0)


def saturated_frequency(
    count: torch.Tensor, length: torch.Tensor, mean_length: torch.Tensor, k1: float, b: float
) -> torch.Tensor:
    """The BM25 term-frequency saturation f (k1 + 1) / (f + k1 (1 - b + b L / L_mean)) of the
    relative frequency f = count / L (0 where L = 0), float64."""
    safe = torch.where(length > 0, length, 1.0)
    f = torch.where(length > 0, count / safe, 0.0)
    norm = k1 * (1.0 - b + b * length / mean_length.clamp_min(1.0))
    return f * (k1 + 1.0) / (f + norm)


@dataclass(frozen=True)
class GroupTokenTables:
    """The contingency tables of every (group, token id) pair present in a batch.

    ``a``/``b``/``c``/``d`` (K,) float64: correct / incorrect responses of the group containing
    the token, and not containing it. ``occ_correct``/``occ_wrong`` (K,): its occurrences in
    the group's correct / incorrect responses; ``len_correct``/``len_wrong`` (K,): the valid
    tokens of those responses. ``token_index`` (B, T) int64: the pair of each valid token
    (0 at padding). ``contrasted`` (K,) bool: the group has both outcomes.
    """

    a: torch.Tensor
    b: torch.Tensor
    c: torch.Tensor
    d: torch.Tensor
    occ_correct: torch.Tensor
    occ_wrong: torch.Tensor
    len_correct: torch.Tensor
    len_wrong: torch.Tensor
    token_index: torch.Tensor
    contrasted: torch.Tensor


def group_token_tables(
    token_ids: torch.Tensor, mask: torch.Tensor, groups: torch.Tensor, correct: torch.Tensor
) -> GroupTokenTables:
    """Count the tables of ``GroupTokenTables`` for ``token_ids`` (B, T) int64 >= 0 at the
    valid tokens of ``mask`` (B, T), ``groups`` (B,) ids and ``correct`` (B,) bool. Pairs are
    keyed g V + v (V = largest id + 1), presence by the keys row V + v."""
    B, T = mask.shape
    dev = mask.device
    _, group = torch.unique(groups, return_inverse=True)
    n_groups = int(group.max()) + 1
    rows, cols = torch.nonzero(mask, as_tuple=True)
    ids = token_ids[rows, cols]
    V = int(ids.max()) + 1
    keys, pair = torch.unique(group[rows] * V + ids, return_inverse=True)
    K = int(keys.numel())
    ok = correct.to(torch.float64)

    def per_pair(index: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return torch.zeros(K, dtype=torch.float64, device=dev).index_add_(0, index, values)

    def per_group(values: torch.Tensor) -> torch.Tensor:
        return torch.zeros(n_groups, dtype=torch.float64, device=dev).index_add_(0, group, values)

    tok_ok = ok[rows]
    present = torch.unique(rows * V + ids)
    p_rows = present // V
    p_pair = torch.searchsorted(keys, group[p_rows] * V + present % V)
    a = per_pair(p_pair, ok[p_rows])
    b = per_pair(p_pair, 1.0 - ok[p_rows])
    key_group = keys // V
    n_correct, n_wrong = per_group(ok)[key_group], per_group(1.0 - ok)[key_group]
    lengths = mask.sum(dim=1).to(torch.float64)
    token_index = torch.zeros(B, T, dtype=torch.int64, device=dev)
    token_index[rows, cols] = pair
    return GroupTokenTables(
        a=a,
        b=b,
        c=n_correct - a,
        d=n_wrong - b,
        occ_correct=per_pair(pair, tok_ok),
        occ_wrong=per_pair(pair, 1.0 - tok_ok),
        len_correct=per_group(ok * lengths)[key_group],
        len_wrong=per_group((1.0 - ok) * lengths)[key_group],
        token_index=token_index,
        contrasted=(n_correct > 0) & (n_wrong > 0),
    )


class KTAEParams(BaseModel):
    """KTAE's parameters at the authors' defaults (their ``ComputeKeyTokens(alpha=1.0,
    beta_ig=1.0, gamma_tf=1.0, top=1.0)``; BM25 k1 = 2, b = 0.5): the weights of the Fisher and
    information-gain terms, whether the frequency contrast joins the direction, the scale of
    the key-token score, and the reward above which a response counts as correct."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    alpha: float = Field(1.0, ge=0.0, allow_inf_nan=False, description="weight of Fisher's test")
    beta: float = Field(1.0, ge=0.0, allow_inf_nan=False, description="weight of the info gain")
    tf: bool = Field(True, description="add the BM25 frequency contrast to the direction")
    tf_k1: float = Field(2.0, gt=0.0, allow_inf_nan=False, description="BM25 k1")
    tf_b: float = Field(0.5, ge=0.0, le=1.0, description="BM25 length normalization b")
    scale: float = Field(1.0, gt=0.0, allow_inf_nan=False, description="bound of |k_v|")
    threshold: float = Field(
        0.0, allow_inf_nan=False, description="a response is correct when its reward > this"
    )

    @model_validator(mode="after")
    def _some_weight(self) -> KTAEParams:
        if self.alpha + self.beta <= 0:
            raise ValueError("alpha + beta must be > 0 (both weights are 0)")
        return self


def key_token_scores(batch: CreditBatch, params: KTAEParams) -> tuple[torch.Tensor, int]:
    """k_{y_t} (B, T) float64 (0 at padding) of the module docstring, and the number of
    responses whose group lacks a correct or an incorrect response (k = 0 there)."""
    rewards, groups = batch.require_groups("ktae")
    mask = batch.mask
    if bool((batch.token_ids[mask] < 0).any()):
        raise CreditError("CreditBatch.token_ids: expected ids >= 0 at the valid tokens")
    correct = rewards > params.threshold
    tables = group_token_tables(batch.token_ids, mask, groups, correct)
    a, b, c, d = tables.a, tables.b, tables.c, tables.d
    alpha, beta = params.alpha, params.beta
    fisher = torch.zeros_like(a)
    if alpha > 0:
        p = fisher_exact_two_sided(a, b, c, d)
        fisher = torch.where(p < 1.0 - P_ONE_TOLERANCE, torch.exp(-2.0 * p), 0.0)
    gain = information_gain(a, b, c, d) if beta > 0 else torch.zeros_like(a)
    n_c = torch.where(tables.contrasted, a + c, 1.0)
    n_w = torch.where(tables.contrasted, b + d, 1.0)
    direction = torch.asin(torch.sqrt((a / n_c).clamp(0, 1))) - torch.asin(
        torch.sqrt((b / n_w).clamp(0, 1))
    )
    if params.tf:
        mean_length = (tables.len_correct + tables.len_wrong) / 2.0
        tf_c = saturated_frequency(
            tables.occ_correct, tables.len_correct, mean_length, params.tf_k1, params.tf_b
        )
        tf_w = saturated_frequency(
            tables.occ_wrong, tables.len_wrong, mean_length, params.tf_k1, params.tf_b
        )
        direction = direction + tf_c / (tf_w + TF_FLOOR) - tf_w / (tf_c + TF_FLOOR)
    s = (alpha * fisher + beta * gain) * direction / (alpha + beta)
    k = params.scale * (2.0 * torch.sigmoid(s) - 1.0)
    k = torch.where(tables.contrasted, k, 0.0)
    per_token = torch.where(mask, k[tables.token_index], 0.0)
    _, group = torch.unique(groups, return_inverse=True)
    right = torch.bincount(group, weights=correct.to(torch.float64))
    size = torch.bincount(group).to(torch.float64)
    one_sided = (right == 0) | (right == size)
    return per_token, int(one_sided[group].sum())


@builtin
class KTAEStrategy(CreditStrategy):
    """KTAE (module docstring; docs/design.md, "Key tokens (KTAE)"): A_t = A_i + k_{y_t}, the
    response advantage plus the key-token score of the sampled token within its group. Reads
    only the token ids and the response rewards and groups (no model signal). A token's
    advantage can change sign; a group with one outcome only keeps A_t = A_i (counted in
    ``uniform_fallbacks``). Diagnostics describe the effective weights A_t / A_i (1 where
    A_i = 0)."""

    name = "ktae"
    Params: ClassVar[type[BaseModel]] = KTAEParams
    params: KTAEParams

    @property
    def reads_groups(self) -> bool:
        return True

    @classmethod
    def critic_form(cls, params: BaseModel) -> CriticRewardForm | None:
        """None: A_t = A_i + k_{y_t} adds a token score to the response advantage, it does
        not move the response reward between tokens."""
        return None

    def assign_with_diagnostics(self, batch: CreditBatch) -> CreditResult:
        k, one_sided = key_token_scores(batch, self.params)
        mask = batch.mask
        a = batch.advantages.to(torch.float64).unsqueeze(1)
        adv = torch.where(mask, a + k, 0.0)
        w = torch.where(a != 0, adv / torch.where(a != 0, a, 1.0), 1.0)
        w = torch.where(mask, w, 0.0)
        return CreditResult(adv.to(torch.float32), weight_diagnostics(w, mask, 0, one_sided))
