"""``TrlCredit.measure``: the direction model's agreement over a TRL generation batch (every
process's rows, groups of ``num_generations`` consecutive rows), against scipy's Spearman
group by group; unscorable rows left out; the gate's EMA moved only by a training batch;
``TrlCredit.apply`` mixes a measured batch's credit at the gate's alpha."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from scipy.stats import spearmanr

from backends.trl.credit import BACKEND, TrlCredit
from credit_core import CreditError
from credit_core.agreement_gate import GateConfig
from credit_core.plan import CreditPlan

#: The accelerator of a one-process run, as ``TrlCredit`` reads it.
ONE: Any = type("One", (), {"num_processes": 1, "device": torch.device("cpu")})()


def _credit(gate: GateConfig | None = None, *, direction_is_reward: bool = False) -> TrlCredit:
    plan = CreditPlan.build("red", BACKEND)  # reads the direction model's prefix rewards
    return TrlCredit(plan, gate, [], ONE, direction_is_reward=direction_is_reward)


def test_measure_is_the_mean_spearman_over_trls_consecutive_groups() -> None:
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(12, generator=g)
    rewards = torch.randn(12, generator=g, dtype=torch.float64)
    rewards[8:] = 0.5  # the third group's reward is constant: skipped
    rewards[1] = math.nan  # every reward function returned None: left out
    metrics = _credit().measure(scores, rewards, 4, advance=True)
    assert metrics is not None and not metrics.direction_is_reward
    rows = [[0, 2, 3], [4, 5, 6, 7]]
    want = sum(spearmanr(scores[r].numpy(), rewards[r].numpy())[0] for r in rows) / 2
    assert (metrics.groups, metrics.skipped) == (2, 1)
    assert metrics.value == pytest.approx(want, abs=1e-12)


def test_only_a_training_batch_moves_the_gate_and_the_reward_model_is_not_measured() -> None:
    credit = _credit(GateConfig(agreement=(0.2, 0.6)))
    scores = torch.arange(8.0)
    rewards = torch.tensor([0.0, 1, 2, 3, 3, 2, 1, 0])  # rho 1 and -1: agreement 0
    looked = credit.measure(scores, rewards, 4, advance=False)
    assert looked is not None and looked.ema is None and looked.alpha == 0.0
    taken = credit.measure(scores, rewards, 4, advance=True)
    assert taken is not None and taken.value == 0.0 and taken.ema == 0.0
    assert credit.run.gate is not None and credit.run.gate.ema == 0.0
    same = _credit(direction_is_reward=True).measure(None, None, 4, advance=True)
    assert same is not None and same.to_dict() == {"credit/direction_is_reward": 1.0}


def test_apply_mixes_a_batchs_credit_at_the_alpha_its_measure_left() -> None:
    """The loss micro-batches of a measured generation batch: red's token advantages mixed
    toward A by the gate's alpha (0.5 at an EMA of 0.4 in [0.2, 0.6]), the EMA unmoved."""
    from credit_core import CreditSignals, assign_credit, get_strategy
    from credit_core.agreement_gate import gate_token_advantages

    credit = _credit(GateConfig(agreement=(0.2, 0.6)))
    assert credit.run.gate is not None
    credit.run.gate.ema = 0.4
    g = torch.Generator().manual_seed(1)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[2, 3:] = False
    batch = {"advantages": torch.tensor([1.0, -0.5, 2.0]), "completion_ids": torch.ones(3, 5)}
    signals = CreditSignals(prefix_rewards=torch.randn(3, 5, generator=g) * mask)
    ids = batch["completion_ids"].long()
    plain = assign_credit(get_strategy("red"), batch["advantages"], mask, ids, signals)
    mixed = credit.apply(batch, mask, signals).token_advantages
    want = gate_token_advantages(plain.token_advantages, batch["advantages"], mask, 0.5)
    assert torch.equal(mixed, want) and not torch.equal(mixed, plain.token_advantages)
    assert credit.run.gate.ema == 0.4


def test_groups_are_trls_blocks_over_every_process_and_never_straddle_processes() -> None:
    second: Any = type("Rank1", (), {"num_processes": 2, "process_index": 1, "device": "cpu"})()
    credit = TrlCredit(
        CreditPlan.build("process", BACKEND), None, [], second, direction_is_reward=False
    )
    assert credit.groups(8, 4).tolist() == [2, 2, 2, 2, 3, 3, 3, 3]
    with pytest.raises(CreditError, match=r"\(6 rows: .* not a multiple of num_generations \(4\)"):
        credit.groups(6, 4)


def test_a_gate_on_the_attribution_is_refused_at_start_up_naming_the_key() -> None:
    """TRL measures a generation batch before its micro-batches' signals exist, so it has no
    summed attribution to rank: the gate's ``measure: attribution`` is refused, not ignored."""
    from credit_core import CreditConfig

    gate = GateConfig(agreement=(0.2, 0.6), measure="attribution")
    plan = CreditPlan.build(CreditConfig.parse({"name": "red", "gate": gate}), BACKEND)
    with pytest.raises(CreditError, match=r"credit\.gate\.measure: 'attribution' ranks the step"):
        TrlCredit(plan, gate, [], ONE, direction_is_reward=False)
