"""assign_credit: the one credit step of every backend."""

from __future__ import annotations

import pytest
import torch

from credit_core import (
    CreditBatch,
    CreditError,
    CreditSignals,
    PolicyStats,
    assign_credit,
    get_strategy,
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
