"""PRIME's tensor algebra (docs/design.md, "Implicit process rewards (PRIME)").

- ``implicit_token_rewards``: r_t = beta q_t at the valid tokens but the last (0 there and at
  padding), as the recipe's token granularity fills them.
- ``prime_advantages`` equals a literal loop transcription of verl's recipe
  (``prime_norm`` batch norm, ``compute_rloo_advantage_return``: ``masked_rloo`` of each
  source, coefficients, returns-to-go, ``masked_whiten``); groups need not be adjacent; a
  step split over processes (``gather``) gives the one-process result; with the implicit
  coefficient 0 every token of a response carries the whitened leave-one-out outcome.
- ``implicit_prm_loss`` is the written-out cross-entropy of sigmoid(beta sum_t q_t).
- The strategy: registered, reads ``implicit_log_ratio`` and the groups, refuses what it lacks.
"""

from __future__ import annotations

import math

import pytest
import torch

from credit_core import CreditError, CreditSignals, assign_credit, get_strategy, list_strategies
from credit_core.implicit_rewards import (
    PrimeStrategy,
    implicit_prm_loss,
    implicit_token_rewards,
    leave_one_out,
    prime_advantages,
)
from credit_core.trained_model import ImplicitPRMSpec

pytestmark = pytest.mark.usefixtures("single_torch_thread")


def _batch(
    seed: int = 0, B: int = 8, T: int = 6, n: int = 4
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log ratio (B, T), right-padded mask (B, T), rewards (B,) 0/1 and more, groups (B,)
    contiguous groups of n)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    rewards = torch.randint(0, 2, (B,), generator=g).to(torch.float64)
    rewards[1] = 0.5
    groups = torch.arange(B) // n
    return q, mask, rewards, groups


def recipe_loop(
    r: list[list[float]],
    mask: list[list[bool]],
    acc: list[float],
    n: int,
    dpo_coef: float,
    gt_coef: float,
    batch_norm: bool,
) -> list[list[float]]:
    """verl recipe/prime, line by line in Python: ``prime_norm`` then
    ``compute_rloo_advantage_return`` (contiguous groups of n; right-padded rows)."""
    B, T = len(r), len(r[0])
    if batch_norm:
        biggest = 0.0
        for i in range(B):
            for t in range(T):
                biggest = max(biggest, abs(sum(r[i][t:])))
        r = [[v / (biggest + 1e-6) for v in row] for row in r]

    def masked_rloo(values: list[list[float]], m: list[list[bool]]) -> list[list[float]]:
        out = [[v if m[i][t] else 0.0 for t, v in enumerate(row)] for i, row in enumerate(values)]
        for start in range(0, B, n):
            means = []
            for p in range(start, start + n):
                picked = [out[p][t] for t in range(T) if m[p][t]]
                means.append(sum(picked) / len(picked))
            baseline = sum(means) / (n - 1)
            for p in range(start, start + n):
                for t in range(T):
                    if m[p][t]:
                        out[p][t] = out[p][t] * (n / (n - 1)) - baseline
        return out

    last = [max(t for t in range(T) if mask[i][t]) for i in range(B)]
    outcome = [[acc[i] if t == last[i] else 0.0 for t in range(T)] for i in range(B)]
    at_last = [[t == last[i] for t in range(T)] for i in range(B)]
    a = masked_rloo(r, mask)
    b = masked_rloo(outcome, at_last)
    final = [[dpo_coef * a[i][t] + gt_coef * b[i][t] for t in range(T)] for i in range(B)]
    returns = [
        [sum(final[i][k] * mask[i][k] for k in range(t, T)) for t in range(T)] for i in range(B)
    ]
    valid = [returns[i][t] for i in range(B) for t in range(T) if mask[i][t]]
    mean = sum(valid) / len(valid)
    var = sum((v - mean) ** 2 for v in valid) / len(valid) * len(valid) / (len(valid) - 1)
    return [
        [(returns[i][t] - mean) / math.sqrt(var + 1e-8) if mask[i][t] else 0.0 for t in range(T)]
        for i in range(B)
    ]


def test_implicit_token_rewards_are_beta_times_the_log_ratio_except_at_the_last_token() -> None:
    q, mask, _, _ = _batch()
    got = implicit_token_rewards(q, mask, 0.05)
    for i in range(q.shape[0]):
        last = int(mask[i].nonzero().max())
        for t in range(q.shape[1]):
            want = 0.05 * float(q[i, t]) if bool(mask[i, t]) and t != last else 0.0
            assert float(got[i, t]) == pytest.approx(want, abs=1e-15)


@pytest.mark.parametrize("batch_norm", [True, False])
@pytest.mark.parametrize(("dpo", "gt"), [(5.0, 5.0), (1.0, 0.0), (0.5, 3.0)])
def test_prime_advantages_equal_the_recipe_written_as_loops(
    batch_norm: bool, dpo: float, gt: float
) -> None:
    q, mask, rewards, groups = _batch(seed=3)
    r = implicit_token_rewards(q, mask, 0.05)
    got = prime_advantages(
        r, mask, rewards, groups, implicit_coef=dpo, outcome_coef=gt, batch_norm=batch_norm
    )
    want = recipe_loop(r.tolist(), mask.tolist(), rewards.tolist(), 4, dpo, gt, batch_norm)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float32), rtol=1e-5, atol=1e-6)
    assert bool((got[~mask] == 0).all())


def test_rows_of_a_group_need_not_be_adjacent() -> None:
    q, mask, rewards, groups = _batch(seed=4)
    r = implicit_token_rewards(q, mask, 0.05)
    perm = torch.randperm(8, generator=torch.Generator().manual_seed(0))
    kw = {"implicit_coef": 5.0, "outcome_coef": 5.0, "batch_norm": True}
    whole = prime_advantages(r, mask, rewards, groups, **kw)
    shuffled = prime_advantages(r[perm], mask[perm], rewards[perm], groups[perm] * 7 + 3, **kw)
    torch.testing.assert_close(shuffled, whole[perm])


def test_a_step_split_over_two_processes_gives_the_one_process_advantages() -> None:
    q, mask, rewards, groups = _batch(seed=5, B=12, n=3)
    r = implicit_token_rewards(q, mask, 0.05)
    kw = {"implicit_coef": 5.0, "outcome_coef": 2.0, "batch_norm": True}
    whole = prime_advantages(r, mask, rewards, groups, **kw)
    halves = [slice(0, 6), slice(6, 12)]  # groups never straddle processes
    sent: list[torch.Tensor] = []
    for h in halves:  # each process's contribution to the one gather
        prime_advantages(
            r[h], mask[h], rewards[h], groups[h], gather=lambda v: sent.append(v) or v, **kw
        )
    joined = torch.cat(sent)
    for h in halves:
        part = prime_advantages(r[h], mask[h], rewards[h], groups[h], gather=lambda v: joined, **kw)
        torch.testing.assert_close(part, whole[h])
    assert not torch.allclose(
        prime_advantages(r[:6], mask[:6], rewards[:6], groups[:6], **kw), whole[:6]
    ), "the step-wide normalization differs from one process's own"


def test_with_the_implicit_coefficient_0_a_response_carries_its_whitened_rloo_outcome() -> None:
    q, mask, rewards, groups = _batch(seed=6)
    adv = prime_advantages(
        q, mask, rewards, groups, implicit_coef=0.0, outcome_coef=5.0, batch_norm=True
    )
    loo = torch.stack(
        [
            rewards[i] - rewards[(groups == groups[i]) & (torch.arange(8) != i)].mean()
            for i in range(8)
        ]
    )
    per_token = loo.unsqueeze(1).expand_as(mask)[mask] * 5.0
    want = (per_token - per_token.mean()) / (per_token.var() + 1e-8).sqrt()
    torch.testing.assert_close(adv[mask], want.float())


def test_leave_one_out_of_one_value_per_row_is_the_reward_minus_the_others_mean() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.5, 2.0, 3.0], dtype=torch.float64)
    groups = torch.tensor([0, 0, 0, 1, 1])
    mask = torch.ones(5, 1, dtype=torch.bool)
    got = leave_one_out(rewards.unsqueeze(1), mask, groups).squeeze(1)
    torch.testing.assert_close(
        got, torch.tensor([0.75, -0.75, 0.0, -1.0, 1.0], dtype=torch.float64)
    )


def test_the_whitened_advantages_have_mean_0_and_unit_variance_over_the_step() -> None:
    q, mask, rewards, groups = _batch(seed=7)
    adv = prime_advantages(
        q, mask, rewards, groups, implicit_coef=5.0, outcome_coef=5.0, batch_norm=True
    )
    assert float(adv[mask].double().mean()) == pytest.approx(0.0, abs=1e-6)
    assert float(adv[mask].double().var()) == pytest.approx(1.0, rel=1e-5)


def test_bad_inputs_name_the_tensor() -> None:
    q, mask, rewards, groups = _batch()
    kw = {"implicit_coef": 5.0, "outcome_coef": 5.0, "batch_norm": True}
    with pytest.raises(
        CreditError, match=r"groups: every group needs >= 2 responses, groups \[9\]"
    ):
        prime_advantages(q, mask, rewards, torch.tensor([0, 0, 0, 0, 1, 1, 1, 9]), **kw)
    bad = q.clone()
    bad[0, 0] = math.nan
    with pytest.raises(CreditError, match="token_rewards: expected finite values"):
        prime_advantages(bad, mask, rewards, groups, **kw)
    with pytest.raises(CreditError, match="implicit_log_ratio: expected finite values"):
        implicit_token_rewards(bad, mask, 0.05)
    with pytest.raises(CreditError, match=r"rewards: expected shape \(8\)"):
        prime_advantages(q, mask, rewards[:3], groups, **kw)
    with pytest.raises(CreditError, match="gather: expected 7 moments per process"):
        prime_advantages(q, mask, rewards, groups, gather=lambda v: v[:5], **kw)


def test_the_prm_loss_is_the_cross_entropy_of_the_sigmoid_of_the_summed_implicit_reward() -> None:
    q, mask, _, _ = _batch(seed=8)
    labels = torch.tensor([1.0, 0.0, 1.0, 0.25, 0.0, 1.0, 0.0, 1.0], dtype=torch.float64)
    got = implicit_prm_loss(q, mask, labels, 0.05)
    for i in range(8):
        s = 0.05 * sum(float(q[i, t]) for t in range(6) if bool(mask[i, t]))
        p = 1.0 / (1.0 + math.exp(-s))
        want = -(float(labels[i]) * math.log(p) + (1 - float(labels[i])) * math.log(1 - p))
        assert float(got[i]) == pytest.approx(want, rel=1e-12)
    with pytest.raises(CreditError, match=r"labels: expected values in \[0, 1\]"):
        implicit_prm_loss(q, mask, labels * 2, 0.05)


def test_labels_are_thresholded_rewards_or_the_rewards_themselves() -> None:
    rewards = torch.tensor([-1.0, 0.0, 0.3, 2.0])
    spec = ImplicitPRMSpec(beta=0.05, lr=1e-6, grad_clip=10.0, threshold=0.0)
    assert spec.labels(rewards).tolist() == [0.0, 0.0, 1.0, 1.0]
    soft = ImplicitPRMSpec(beta=0.05, lr=1e-6, grad_clip=10.0, threshold=None)
    assert soft.labels(torch.tensor([0.0, 0.25, 1.0])).tolist() == [0.0, 0.25, 1.0]
    with pytest.raises(CreditError, match=r"rewards: .* in \[0, 1\], got min -1.0, max 2.0"):
        soft.labels(rewards)


def test_prime_is_registered_with_the_recipes_defaults_and_hosts_an_implicit_prm() -> None:
    assert "prime" in list_strategies()
    strategy = get_strategy("prime")
    assert isinstance(strategy, PrimeStrategy)
    assert strategy.requires == {"implicit_log_ratio"} and strategy.reads_groups
    assert strategy.gathers
    assert strategy.implicit_prm == ImplicitPRMSpec(
        beta=0.05, lr=1e-6, grad_clip=10.0, threshold=0.0
    )
    assert get_strategy("uniform").implicit_prm is None
    tuned = get_strategy({"name": "prime", "prm_lr": 1e-3, "threshold": None})
    assert tuned.implicit_prm is not None and tuned.implicit_prm.lr == 1e-3


def test_the_strategy_gives_prime_advantages_of_its_signal() -> None:
    q, mask, rewards, groups = _batch(seed=9)
    strategy = get_strategy({"name": "prime", "beta": 0.1, "outcome_coef": 2.0})
    ids = torch.zeros(8, 6, dtype=torch.long)
    result = assign_credit(
        strategy,
        torch.ones(8),
        mask,
        ids,
        CreditSignals(implicit_log_ratio=q),
        rewards=rewards,
        groups=groups,
    )
    want = prime_advantages(
        implicit_token_rewards(q, mask, 0.1),
        mask,
        rewards,
        groups,
        implicit_coef=5.0,
        outcome_coef=2.0,
        batch_norm=True,
    )
    torch.testing.assert_close(result.token_advantages, want)
    with pytest.raises(CreditError, match="requires signal 'implicit_log_ratio'"):
        assign_credit(strategy, torch.ones(8), mask, ids, rewards=rewards, groups=groups)
    with pytest.raises(
        CreditError,
        match=r"reads the response rewards and their groups, but CreditBatch.rewards is None",
    ):
        assign_credit(strategy, torch.ones(8), mask, ids, CreditSignals(implicit_log_ratio=q))
