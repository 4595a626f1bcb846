"""P2T (docs/design.md, "Gradient x input attribution (P2T)").

- ``reward_attribution``: r_t = (E[y_t] - e_null) . g_t, checked against a loop over tokens;
  0 at padding; bad input is a ``CreditError`` naming the tensor.
- ``mean`` mode: w_t proportional to max(sign(A) r_t, 0) + eps with mean 1 over the response:
  the sign of A and its per-response mean are kept (hypothesis), and the weights are exactly
  that formula.
- ``paper`` mode: r_t turned into advantages by the group-baselined return-to-go, checked
  against a brute-force loop of A_t = (G_t - mean_g G_0) / (std_g G_0 + 1e-6).
- The strategy reads ``reward_attribution`` only, and says which null its backend subtracts.
"""

from __future__ import annotations

import statistics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from credit_core import CreditError, CreditSignals, assign_credit, get_strategy
from credit_core.attribution import NULL_EMBEDDINGS, reward_attribution
from tests.credit_core.test_baseline_strategies import assert_mean_keeping, random_batch

SETTINGS = settings(max_examples=40, deadline=None)


def test_the_attribution_is_the_dot_product_of_embedding_minus_null_with_the_gradient() -> None:
    gen = torch.Generator().manual_seed(0)
    B, T, V, d = 3, 5, 11, 4
    g = torch.randn(B, T, d, dtype=torch.float64, generator=gen)
    E = torch.randn(V, d, dtype=torch.float64, generator=gen)
    null = torch.randn(d, dtype=torch.float64, generator=gen)
    ids = torch.randint(0, V, (B, T), generator=gen)
    mask = torch.rand(B, T, generator=gen) < 0.7
    ids[~mask] = -1  # padding may hold any id
    got = reward_attribution(g, ids, mask, E, null)
    expected = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            if mask[b, t]:
                expected[b, t] = torch.dot(E[ids[b, t]] - null, g[b, t])
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=1e-12)
    f32 = reward_attribution(g.float(), ids, mask, E.float(), null.float())
    assert f32.dtype == torch.float32


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"ids": torch.full((2, 3), 7)}, r"token_ids: expected values in \[0, 5\)"),
        ({"null": torch.zeros(3)}, r"null_embedding: expected shape \(4\)"),
        ({"E": torch.zeros(5, 3)}, r"reward_embedding: expected shape \(\*, 4\)"),
        ({"mask": torch.ones(2, 3)}, r"mask: expected dtype torch.bool"),
        ({"ids": torch.zeros(2, 3)}, r"token_ids: expected an integer dtype"),
    ],
)
def test_bad_attribution_input_names_the_tensor(
    change: dict[str, torch.Tensor], message: str
) -> None:
    args = {
        "g": torch.zeros(2, 3, 4),
        "ids": torch.zeros(2, 3, dtype=torch.long),
        "mask": torch.ones(2, 3, dtype=torch.bool),
        "E": torch.zeros(5, 4),
        "null": torch.zeros(4),
    }
    args.update(change)
    with pytest.raises(CreditError, match=message):
        reward_attribution(args["g"], args["ids"], args["mask"], args["E"], args["null"])


def _ids(mask: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(mask, dtype=torch.long)


@given(seed=st.integers(0, 10_000), eps=st.sampled_from([1e-6, 1e-3, 0.1]))
@SETTINGS
def test_mean_mode_keeps_sign_and_mean_of_a_and_weights_the_aligned_token_rewards(
    seed: int, eps: float
) -> None:
    adv, mask = random_batch(seed)
    r = torch.randn(mask.shape, generator=torch.Generator().manual_seed(seed + 1))
    r[3] = -torch.sign(adv[3]) * r[3].abs()  # every token opposes A: uniform from the floor
    result = assign_credit(
        get_strategy("p2t", eps=eps), adv, mask, _ids(mask), CreditSignals(reward_attribution=r)
    )
    assert_mean_keeping(adv, mask, result.token_advantages)
    raw = torch.where(mask, (torch.sign(adv).unsqueeze(1) * r).clamp_min(0) + eps, 0.0)
    w = raw * mask.sum(dim=1, keepdim=True) / raw.sum(dim=1, keepdim=True)
    torch.testing.assert_close(
        result.token_advantages, (adv.unsqueeze(1) * w).float(), atol=1e-6, rtol=1e-5
    )
    torch.testing.assert_close(result.token_advantages[3], torch.where(mask[3], adv[3], 0.0))
    assert result.diagnostics.uniform_fallbacks >= 1
    assert result.diagnostics.weight_min >= 0


def brute_force_group_returns(
    r: torch.Tensor, mask: torch.Tensor, groups: torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
    """A_t = (G_t - mean_g G_0) / (std_g G_0 + eps), G_t = sum_{k >= t valid} r_k, written
    as loops (docs/design.md, "Token rewards to advantages"); 0 for a group of one total."""
    B, T = mask.shape
    G = [
        [sum(float(r[b, k]) for k in range(t, T) if mask[b, k]) for t in range(T)] for b in range(B)
    ]
    totals = [G[b][int(torch.nonzero(mask[b]).min())] for b in range(B)]
    out = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        members = [totals[j] for j in range(B) if groups[j] == groups[b]]
        mean, std = statistics.fmean(members), statistics.stdev(members)
        for t in range(T):
            if mask[b, t] and std > 0:
                out[b, t] = (G[b][t] - mean) / (std + eps)
    return out


@given(seed=st.integers(0, 10_000))
@SETTINGS
def test_paper_mode_is_the_group_baselined_return_to_go_of_the_token_rewards(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.rand(8, generator=gen)
    _, mask = random_batch(seed, B=8, T=7)
    groups = torch.tensor([0, 1, 0, 1, 1, 0, 0, 1])  # groups need not be adjacent
    r = torch.randn(mask.shape, generator=gen, dtype=torch.float64)
    strategy = get_strategy("p2t", mode="paper")
    assert strategy.reads_groups and not get_strategy("p2t").reads_groups
    result = assign_credit(
        strategy,
        rewards - rewards.mean(),  # A_i enters only the diagnostics of the paper form
        mask,
        _ids(mask),
        CreditSignals(reward_attribution=r),
        rewards=rewards,
        groups=groups,
    )
    expected = brute_force_group_returns(r, mask, groups)
    torch.testing.assert_close(result.token_advantages, expected.float(), atol=1e-5, rtol=1e-5)


def test_paper_mode_without_groups_is_an_error_naming_them() -> None:
    adv, mask = torch.ones(2), torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(CreditError, match=r"reads the response rewards .* CreditBatch.rewards"):
        assign_credit(
            get_strategy("p2t", mode="paper"),
            adv,
            mask,
            _ids(mask),
            CreditSignals(reward_attribution=torch.ones(2, 3)),
        )


def test_p2t_reads_the_attribution_alone_and_refuses_a_non_finite_one() -> None:
    adv, mask = torch.ones(2), torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(CreditError, match="requires signal 'reward_attribution'"):
        assign_credit(get_strategy("p2t"), adv, mask, _ids(mask))
    with pytest.raises(CreditError, match="does not read"):
        assign_credit(
            get_strategy("p2t"),
            adv,
            mask,
            _ids(mask),
            CreditSignals(reward_grad=torch.ones(2, 3, 4)),
        )
    bad = torch.tensor([[0.1, 0.2, 0.3], [0.1, float("nan"), 0.3]])
    with pytest.raises(CreditError, match=r"reward_attribution: expected finite .* rows \[1\]"):
        assign_credit(
            get_strategy("p2t"), adv, mask, _ids(mask), CreditSignals(reward_attribution=bad)
        )


@pytest.mark.parametrize("null", NULL_EMBEDDINGS)
def test_the_strategy_names_the_null_its_backend_subtracts(null: str) -> None:
    assert get_strategy("p2t", null=null).attribution_null == null
    assert get_strategy("p2t").attribution_null == "pad"
    assert get_strategy("datc").attribution_null == "pad"  # the default, unused by datc


@pytest.mark.parametrize("bad", [{"null": "eos"}, {"mode": "soft"}, {"eps": 0.0}, {"eps": True}])
def test_p2t_parameters_are_validated(bad: dict[str, object]) -> None:
    with pytest.raises(CreditError):
        get_strategy("p2t", **bad)
