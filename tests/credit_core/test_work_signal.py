"""The ``unsigned_work`` signal in the credit contract: every DATC-family strategy gives the
same token advantages from W0 as from ``policy_stats`` + ``reward_grad``; backends learn what
to compute from ``signals_to_compute``; plugins without ``work_requires`` are unchanged."""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

import pytest
import torch

from credit_core import (
    CreditBatch,
    CreditError,
    ScoreStrategy,
    get_strategy,
    list_strategies,
    policy_stats,
    strategy_class,
    streamed_unsigned_work,
    token_work,
)

pytestmark = pytest.mark.usefixtures("single_torch_thread")

DATC_FAMILY = ("datc", "datc_unsigned", "datc_nosign", "datc_shuffled", "datc_inverse")


def _batches(seed: int = 0, B: int = 4, T: int = 9, V: int = 50, d: int = 7, H: int = 6) -> dict:
    """The same responses as three batches: classic signals, W0 from them, streamed W0."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, H, generator=gen)
    weight = torch.randn(V, H, generator=gen)
    E = torch.randn(V, d, generator=gen)
    y = torch.randint(0, V, (B, T), generator=gen)
    mask = torch.rand(B, T, generator=gen) < 0.7
    mask[:, 0] = True
    g = torch.randn(B, T, d, generator=gen) * mask.unsqueeze(2)  # 0 at padding, as an RM gives
    A = torch.tensor([1.5, -0.7, 0.0, 2.0])[:B]
    stats = policy_stats(hidden, weight, y, E, chunk_size=16)
    classic = CreditBatch(A, mask, y, reward_grad=g, policy_stats=stats)
    return {
        "classic": classic,
        "derived": CreditBatch(A, mask, y, unsigned_work=token_work(stats, g, None)),
        "streamed": CreditBatch(
            A, mask, y, unsigned_work=streamed_unsigned_work(hidden, weight, y, E, g, chunk_size=16)
        ),
    }


@pytest.mark.parametrize("name", DATC_FAMILY)
def test_every_datc_strategy_gives_the_same_token_advantages_from_either_signal(
    name: str,
) -> None:
    batches = _batches()
    params = {"beta": 3.0, "lam": 0.8}
    want = get_strategy(name, **params).assign(batches["classic"])
    # The same W0 numbers: bitwise the same advantages (fresh strategies: same shuffle seed).
    assert torch.equal(get_strategy(name, **params).assign(batches["derived"]), want)
    # The streamed kernel's W0 differs by float rounding only.
    got = get_strategy(name, **params).assign(batches["streamed"])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert not torch.equal(want, get_strategy("uniform").assign(batches["classic"]))


def test_declared_signal_sets_and_what_a_backend_computes() -> None:
    for name in DATC_FAMILY:
        cls = strategy_class(name)
        assert cls.requires == frozenset({"reward_grad", "policy_stats"})
        assert cls.work_requires == frozenset({"unsigned_work"})
        assert cls.signals_to_compute(reward_grad_first=True) == frozenset({"unsigned_work"})
        assert cls.signals_to_compute(reward_grad_first=False) == cls.requires
    for name in ("uniform", "saliency"):
        cls = strategy_class(name)
        assert cls.work_requires is None
        assert cls.signals_to_compute(reward_grad_first=True) == cls.requires
    assert set(list_strategies()) >= {*DATC_FAMILY, "uniform", "saliency"}


def test_a_batch_without_either_signal_set_names_the_missing_signal() -> None:
    batches = _batches()
    strategy = get_strategy("datc")
    with pytest.raises(CreditError, match="'datc' requires signal 'policy_stats'"):
        strategy.assign(replace(batches["classic"], policy_stats=None))
    with pytest.raises(CreditError, match="'datc' requires signal 'policy_stats'"):
        strategy.assign(replace(batches["derived"], unsigned_work=None))
    # W0 present: the classic signals are not needed, and not read when present too.
    both = replace(batches["classic"], unsigned_work=torch.zeros(4, 9))
    assert torch.equal(strategy.assign(both), get_strategy("uniform").assign(both))


def test_unsigned_work_is_validated() -> None:
    batch = _batches()["classic"]
    with pytest.raises(CreditError, match=r"CreditBatch.unsigned_work: expected shape \(4, 9\)"):
        replace(batch, unsigned_work=torch.zeros(4, 8))
    with pytest.raises(CreditError, match=r"CreditBatch.unsigned_work: expected a floating"):
        replace(batch, unsigned_work=torch.zeros(4, 9, dtype=torch.long))


def test_a_plugin_without_work_requires_keeps_reading_the_classic_signals() -> None:
    class PolicyOnly(ScoreStrategy):
        name = "test_policy_only"
        requires = frozenset({"policy_stats"})

        def scores(self, batch: CreditBatch) -> torch.Tensor:
            assert batch.policy_stats is not None
            return batch.policy_stats.p_sampled

    assert PolicyOnly.signals_to_compute(reward_grad_first=True) == frozenset({"policy_stats"})
    batch = _batches()["derived"]
    with pytest.raises(CreditError, match="'test_policy_only' requires signal 'policy_stats'"):
        PolicyOnly().assign(batch)


def test_work_requires_must_name_unsigned_work_within_the_signals() -> None:
    with pytest.raises(CreditError, match="'work_requires' must be None or a frozenset"):

        class Broken(ScoreStrategy):  # the definition itself must fail
            name = "test_broken"
            work_requires: ClassVar[frozenset[str] | None] = frozenset({"reward_grad"})

            def scores(self, batch: CreditBatch) -> torch.Tensor:
                return batch.mask.float()
