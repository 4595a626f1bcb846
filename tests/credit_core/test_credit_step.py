"""assign_credit: the one credit step of every backend."""

from __future__ import annotations

import math

import pytest
import torch

from credit_core import (
    CreditBatch,
    CreditError,
    CreditSignals,
    PolicyStats,
    TokenRewards,
    assign_credit,
    get_strategy,
    policy_stats_from_logits,
    token_work,
)

B, T, D, V = 3, 5, 4, 11


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, CreditSignals]:
    gen = torch.Generator().manual_seed(0)
    advantages = torch.tensor([1.0, -0.5, 2.0])
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    token_ids = torch.randint(0, V, (B, T), generator=gen)
    p = torch.rand(B, T, generator=gen)
    stats = PolicyStats(
        p_sampled=p,
        p_sq=p**2 + 0.1,
        m1=torch.randn(B, T, D, generator=gen),
        m2=torch.randn(B, T, D, generator=gen),
        sampled_emb=torch.randn(B, T, D, generator=gen),
    )
    grad = torch.randn(B, T, D, generator=gen)
    return advantages, mask, token_ids, CreditSignals(reward_grad=grad, policy_stats=stats)


def test_the_step_equals_the_strategy_on_the_same_batch() -> None:
    adv, mask, ids, signals = _inputs()
    datc = get_strategy("datc", beta=1.0, lam=0.5)
    got = assign_credit(datc, adv, mask, ids, signals)
    want = datc.assign_with_diagnostics(
        CreditBatch(adv, mask, ids, signals.reward_grad, signals.policy_stats)
    )
    assert torch.equal(got.token_advantages, want.token_advantages)
    assert got.diagnostics == want.diagnostics
    assert not torch.equal(
        got.token_advantages,
        assign_credit(get_strategy("uniform"), adv, mask, ids).token_advantages,
    )


def test_a_signal_the_strategy_does_not_read_is_an_error() -> None:
    adv, mask, ids, signals = _inputs()
    with pytest.raises(
        CreditError, match=r"'uniform' does not read \['policy_stats', 'reward_grad'\]"
    ):
        assign_credit(get_strategy("uniform"), adv, mask, ids, signals)
    saliency = get_strategy("saliency")
    with pytest.raises(CreditError, match=r"'saliency' does not read \['policy_stats'\]"):
        assign_credit(saliency, adv, mask, ids, signals)
    only_grad = CreditSignals(reward_grad=signals.reward_grad)
    assert assign_credit(saliency, adv, mask, ids, only_grad).token_advantages.shape == (B, T)


def test_a_missing_signal_is_an_error_naming_it() -> None:
    adv, mask, ids, signals = _inputs()
    with pytest.raises(CreditError, match="requires signal 'policy_stats'"):
        assign_credit(get_strategy("datc"), adv, mask, ids, CreditSignals(signals.reward_grad))


def test_select_takes_the_same_rows_of_every_signal() -> None:
    _, _, _, signals = _inputs()
    part = signals.select(slice(1, 3))
    assert part.computed == frozenset({"reward_grad", "policy_stats"})
    assert part.reward_grad is not None and part.policy_stats is not None
    assert signals.reward_grad is not None and signals.policy_stats is not None
    assert torch.equal(part.reward_grad, signals.reward_grad[1:3])
    assert torch.equal(part.policy_stats.m2, signals.policy_stats.m2[1:3])
    assert CreditSignals().select(slice(0, 1)).computed == frozenset()


def test_the_unsigned_work_path_gives_datc_s_credit_and_reads_nothing_else() -> None:
    adv, mask, ids, signals = _inputs()
    assert signals.reward_grad is not None and signals.policy_stats is not None
    w0 = token_work(signals.policy_stats, signals.reward_grad, None)
    datc = get_strategy("datc", beta=1.0, lam=0.5)
    classic = assign_credit(datc, adv, mask, ids, signals)
    streamed = assign_credit(datc, adv, mask, ids, CreditSignals(unsigned_work=w0))
    torch.testing.assert_close(streamed.token_advantages, classic.token_advantages)
    both = CreditSignals(reward_grad=signals.reward_grad, unsigned_work=w0)
    with pytest.raises(CreditError, match=r"'datc' does not read \['reward_grad'\]"):
        assign_credit(datc, adv, mask, ids, both)


# Rows without a valid token: the strategy runs on the others, zeros elsewhere.

#: (name, params) of strategies covering every signal, the groups, the answer span, a gather
#: and the paper forms' token rewards.
EMPTY_ROW_CASES = [
    ("uniform", {}),
    ("datc", {"beta": 2.0, "lam": 0.5}),
    ("datc_shuffled", {}),
    ("saliency", {}),
    ("entropy_top", {"rho": 0.4}),
    ("random_top", {"rho": 0.4}),
    ("abc", {}),
    ("abc", {"mode": "paper"}),
    ("red", {"mode": "paper"}),
    ("p2t", {}),
    ("oar_g", {}),
    ("ktae", {}),
    ("prime", {}),
    ("process", {"outcome_weight": 0.5}),
]
#: Rows 1 and 4 are empty; each group of three keeps two responses.
EMPTY = torch.tensor([False, True, False, False, True, False])
GROUPS = torch.tensor([0, 0, 0, 1, 1, 1])


def _every_signal(mask: torch.Tensor, seed: int = 3) -> dict[str, object]:
    """All of ``assign_credit``'s inputs for a (B, T) ``mask``, every signal included, each
    valid as ``CreditBatch`` states it (attention sums to 1 over a row's valid tokens)."""
    gen = torch.Generator().manual_seed(seed)
    n, t = mask.shape
    attention = torch.where(mask, torch.rand(n, t, generator=gen) + 0.1, 0.0)
    attention = attention / attention.sum(dim=1, keepdim=True).clamp_min(1e-30)
    answer = mask & (torch.arange(t) >= 3)
    rewards = torch.rand(n, generator=gen)
    signals = CreditSignals(
        reward_grad=torch.randn(n, t, D, generator=gen),
        policy_stats=policy_stats_from_logits(
            torch.randn(n, t, V, generator=gen) * 2,
            torch.randint(0, V, (n, t), generator=gen),
            torch.randn(V, D, generator=gen),
            chunk_size=4,
        ),
        token_entropy=torch.rand(n, t, generator=gen) * 2,
        reward_attention=attention,
        prefix_rewards=torch.randn(n, t, generator=gen),
        reward_attribution=torch.randn(n, t, generator=gen),
        implicit_log_ratio=torch.randn(n, t, generator=gen) * 0.1,
        answer_saliency=torch.where(mask & ~answer, torch.rand(n, t, generator=gen), 0.0),
        token_rewards=TokenRewards.from_dense(
            [torch.randn(int(k), generator=gen) for k in mask.sum(dim=1)], mask
        ),
    )
    return {
        "advantages": rewards - 0.5,
        "mask": mask,
        "token_ids": torch.randint(0, V, (n, t), generator=gen),
        "signals": signals,
        "rewards": rewards,
        "groups": GROUPS[:n],
        "answer_mask": answer,
    }


def _call(name: str, params: dict[str, object], inputs: dict[str, object], **kw: object):
    """``assign_credit`` of a fresh ``name`` strategy on ``inputs``, given the signals it reads."""
    strategy = get_strategy(name, **params)
    signals = inputs["signals"]
    assert isinstance(signals, CreditSignals)
    reads = strategy.signals_to_compute(reward_grad_first=False)
    kept = CreditSignals(
        **{s: getattr(signals, s) for s in reads},
        token_rewards=signals.token_rewards if strategy.reads_token_rewards else None,
    )
    return assign_credit(
        strategy,
        inputs["advantages"],
        inputs["mask"],
        inputs["token_ids"],
        kept,
        rewards=inputs["rewards"],
        groups=inputs["groups"],
        answer_mask=inputs["answer_mask"],
        **kw,
    )


def _rows(inputs: dict[str, object], rows: torch.Tensor) -> dict[str, object]:
    out = {k: v[rows] for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    signals = inputs["signals"]
    assert isinstance(signals, CreditSignals)
    return {**out, "signals": signals.select(rows)}


@pytest.mark.parametrize(("name", "params"), EMPTY_ROW_CASES)
def test_empty_rows_get_zeros_and_the_others_the_credit_of_the_valid_rows_alone(
    name: str, params: dict[str, object]
) -> None:
    mask = torch.rand(6, 7, generator=torch.Generator().manual_seed(1)) < 0.7
    mask[:, 0] = True
    mask[EMPTY] = False
    inputs = _every_signal(mask)
    got = _call(name, params, inputs)
    alone = _call(name, params, _rows(inputs, ~EMPTY))
    want = torch.zeros(6, 7, dtype=torch.float32)
    want[~EMPTY] = alone.token_advantages
    assert torch.equal(got.token_advantages, want)
    assert got.token_advantages[EMPTY].eq(0).all()
    assert got.diagnostics == alone.diagnostics
    if alone.token_rewards is None:
        assert got.token_rewards is None
    else:
        assert got.token_rewards is not None
        assert torch.equal(got.token_rewards[~EMPTY], alone.token_rewards)
        assert got.token_rewards[EMPTY].eq(0).all()


@pytest.mark.parametrize(("name", "params"), EMPTY_ROW_CASES)
def test_a_batch_without_a_valid_token_gets_zeros(name: str, params: dict[str, object]) -> None:
    inputs = _every_signal(torch.zeros(6, 7, dtype=torch.bool))
    calls: list[torch.Tensor] = []

    def gather(values: torch.Tensor) -> torch.Tensor:
        calls.append(values)
        return values

    result = _call(name, params, inputs, gather=gather)
    assert torch.equal(result.token_advantages, torch.zeros(6, 7))
    assert result.token_advantages.dtype == torch.float32
    d = result.diagnostics  # nothing to summarize, no fallback
    assert all(math.isnan(v) for v in (d.weight_max, d.weight_min, d.weight_entropy))
    assert math.isnan(d.frac_upweighted)
    assert (d.nonfinite_fallbacks, d.uniform_fallbacks) == (0, 0)
    strategy = get_strategy(name, **params)
    if strategy.critic_reward_form == "token_rewards":
        assert result.token_rewards is not None and result.token_rewards.eq(0).all()
    else:
        assert result.token_rewards is None
    # a gathering strategy still takes part in the step's one collective, with nothing
    assert [c.shape for c in calls] == ([torch.Size([0])] if strategy.gathers else [])
    assert all(c.dtype == torch.float64 for c in calls)


def test_a_bad_empty_row_is_still_refused_by_name() -> None:
    """Accepting empty rows accepts nothing else: the batch is validated whole first."""
    inputs = _every_signal(torch.zeros(2, 7, dtype=torch.bool))
    inputs["answer_mask"] = torch.ones(2, 7, dtype=torch.bool)
    with pytest.raises(CreditError, match=r"CreditBatch.answer_mask: .*rows \[0, 1\] mark"):
        _call("oar_g", {}, inputs)
    inputs = _every_signal(torch.zeros(2, 7, dtype=torch.bool))
    inputs["token_ids"] = torch.zeros(2, 6, dtype=torch.long)
    with pytest.raises(CreditError, match=r"CreditBatch.token_ids"):
        _call("uniform", {}, inputs)


def _two_ranks(rank: int, world: int, init_file: str, out_dir: str) -> None:
    """Rank 0 holds rows with valid tokens, rank 1 none; both call ``assign_credit`` of a
    gathering strategy with a gather over the gloo group (values of any dtype)."""
    import torch.distributed as dist

    from tests.helpers.gloo_ranks import init_group

    init_group(rank, world, init_file)

    def gather(values: torch.Tensor) -> torch.Tensor:
        counts = [torch.zeros(1, dtype=torch.long) for _ in range(world)]
        dist.all_gather(counts, torch.tensor([values.numel()]))
        longest = int(max(int(c) for c in counts))
        padded = torch.zeros(longest, dtype=torch.float64)
        padded[: values.numel()] = values
        parts = [torch.zeros(longest, dtype=torch.float64) for _ in range(world)]
        dist.all_gather(parts, padded)
        joined = torch.cat([p[: int(c)] for p, c in zip(parts, counts, strict=True)])
        return joined.to(values.dtype)

    mask = torch.ones(6, 7, dtype=torch.bool) if rank == 0 else torch.zeros(6, 7, dtype=torch.bool)
    inputs = _every_signal(mask)
    for name, params in (("entropy_top", {"rho": 0.4}), ("prime", {})):
        result = _call(name, params, inputs, gather=gather)
        torch.save(result.token_advantages, f"{out_dir}/{name}_rank{rank}.pt")
    dist.destroy_process_group()


def test_a_process_without_a_valid_row_still_takes_part_in_the_gather(tmp_path) -> None:
    """Two gloo processes: the one without a valid row does not hang the other, which gets
    the credit of its rows alone (the empty process contributes no value)."""
    from tests.helpers.gloo_ranks import run_ranks

    run_ranks(_two_ranks, tmp_path, (str(tmp_path),), timeout=180.0)
    inputs = _every_signal(torch.ones(6, 7, dtype=torch.bool))
    for name, params in (("entropy_top", {"rho": 0.4}), ("prime", {})):
        alone = _call(name, params, inputs).token_advantages
        assert torch.equal(torch.load(tmp_path / f"{name}_rank0.pt"), alone)
        assert torch.equal(torch.load(tmp_path / f"{name}_rank1.pt"), torch.zeros(6, 7))
