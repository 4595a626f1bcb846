"""``CreditRun``: ``assign_credit``, then the direction model's agreement and the gate's mix
(docs/design.md, "Trusting the direction model"); its state resumes the gate bit for bit."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from backends.common.credit import AgreementMetrics, CreditRun, CreditStep
from credit_core import CreditConfig, CreditError, CreditSignals, assign_credit, get_strategy
from credit_core.agreement_gate import GateConfig, direction_agreement, gate_token_advantages
from credit_core.batch import SIGNALS
from credit_core.plan import FEATURES, Backend, CreditPlan

pytestmark = pytest.mark.usefixtures("single_torch_thread")

BACKEND = Backend("test", "credit", SIGNALS, FEATURES, hint="a test backend")
G, GROUPS, T = 4, 3, 7
GATE = GateConfig(agreement=(-0.5, 0.8), decay=0.7)


def step(seed: int, *, n_groups: int = GROUPS) -> dict[str, torch.Tensor]:
    """One step's inputs for ``red`` (prefix rewards): rewards with ties, scores, groups."""
    gen = torch.Generator().manual_seed(seed)
    B = n_groups * G
    rewards = torch.randint(0, 3, (B,), generator=gen).float()
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    return {
        "rewards": rewards,
        "scores": rewards + torch.randn(B, generator=gen),  # agrees in part
        "groups": torch.arange(B) // G,
        "advantages": rewards - rewards.view(-1, G).mean(dim=1).repeat_interleave(G),
        "mask": torch.arange(T)[None, :] < lengths[:, None],
        "ids": torch.randint(0, 50, (B, T), generator=gen),
        "prefix": torch.randn(B, T, generator=gen),
    }


def apply(
    run: CreditRun,
    s: dict[str, torch.Tensor],
    signals: CreditSignals | None = None,
    **kwargs: Any,
) -> CreditStep:
    """``run``'s credit of step ``s``, with ``signals`` (default: red's prefix rewards)."""
    return run.apply(
        s["advantages"],
        s["mask"],
        s["ids"],
        signals or CreditSignals(prefix_rewards=s["prefix"]),
        rewards=s["rewards"],
        groups=s["groups"],
        direction_scores=s["scores"],
        **kwargs,
    )


def red_run(gate: GateConfig | None = None, **kwargs: bool) -> CreditRun:
    return CreditRun.build(CreditConfig.parse({"name": "red", "gate": gate}), BACKEND, **kwargs)


def plain_credit(run: CreditRun, s: dict[str, torch.Tensor]) -> torch.Tensor:
    return assign_credit(
        run.strategy,
        s["advantages"],
        s["mask"],
        s["ids"],
        CreditSignals(prefix_rewards=s["prefix"]),
        rewards=s["rewards"],
        groups=s["groups"],
    ).token_advantages


def test_without_a_gate_the_credit_is_assign_credit_s_bit_for_bit_with_the_agreement() -> None:
    run = red_run()
    for seed in range(3):
        s = step(seed)
        out = apply(run, s)
        assert torch.equal(out.result.token_advantages, plain_credit(run, s))
        want = direction_agreement(s["scores"], s["rewards"], s["groups"])
        assert out.agreement == AgreementMetrics(False, want.value, want.groups, want.skipped)
    assert run.state_dict() == {}


def test_the_gate_mixes_by_the_alpha_of_the_ema_after_each_step() -> None:
    run = red_run(GATE)
    ema = None
    for seed in range(6):
        s = step(seed)
        out = apply(run, s)
        value = direction_agreement(s["scores"], s["rewards"], s["groups"]).value
        ema = value if ema is None else 0.7 * ema + (1 - 0.7) * value
        alpha = min(1.0, max(0.0, (ema - (-0.5)) / (0.8 - (-0.5))))
        assert out.agreement is not None
        assert (out.agreement.ema, out.agreement.alpha) == (ema, alpha)
        want = gate_token_advantages(plain_credit(run, s), s["advantages"], s["mask"], alpha)
        assert torch.equal(out.result.token_advantages, want)
        metrics = out.agreement.to_dict()
        assert metrics["credit/gate_alpha"] == alpha
        assert metrics["credit/direction_agreement_ema"] == ema


def test_a_look_that_does_not_advance_leaves_the_ema() -> None:
    run = red_run(GATE)
    apply(run, step(0))
    before = run.state_dict()
    out = apply(run, step(1), advance=False)
    assert run.state_dict() == before
    assert out.agreement is not None and out.agreement.alpha == run.gate.alpha  # type: ignore[union-attr]


def test_the_state_resumes_the_ema_bit_for_bit() -> None:
    whole = red_run(GATE)
    first = red_run(GATE)
    outs = [apply(whole, step(seed)) for seed in range(5)]
    for seed in range(3):
        apply(first, step(seed))
    resumed = red_run(GATE)
    resumed.load_state_dict(first.state_dict())
    for seed in (3, 4):
        got = apply(resumed, step(seed))
        assert got.agreement == outs[seed].agreement
        assert torch.equal(got.result.token_advantages, outs[seed].result.token_advantages)
    with pytest.raises(CreditError, match="credit state: the run has no gate"):
        red_run().load_state_dict(first.state_dict())


def test_processes_with_their_own_groups_report_the_step_s_agreement() -> None:
    s = step(7, n_groups=5)
    halves = [{k: v[: 2 * G] for k, v in s.items()}, {k: v[2 * G :] for k, v in s.items()}]
    sent: list[torch.Tensor] = []

    def send(t: torch.Tensor) -> torch.Tensor:  # the other process's part of the sum
        sent.append(t)
        return t

    apply(red_run(), halves[1], reduce_sum=send)
    got = apply(red_run(), halves[0], reduce_sum=lambda t: t + sent[0]).agreement
    want = direction_agreement(s["scores"], s["rewards"], s["groups"])
    assert got is not None and (got.groups, got.skipped) == (want.groups, want.skipped)
    assert got.value == pytest.approx(want.value, abs=1e-12)


def test_a_direction_model_that_is_the_reward_is_reported_not_measured() -> None:
    out = apply(red_run(direction_is_reward=True), step(0))
    assert out.agreement == AgreementMetrics(direction_is_reward=True)
    assert out.agreement.to_dict() == {"credit/direction_is_reward": 1.0}
    with pytest.raises(CreditError, match=r"credit\.gate: the reward is the direction model.s own"):
        red_run(GATE, direction_is_reward=True)


def test_a_strategy_without_a_direction_model_reports_nothing() -> None:
    run = CreditRun.build(CreditConfig.parse("uniform"), BACKEND)
    s = step(0)
    out = run.apply(s["advantages"], s["mask"], s["ids"])
    assert out.agreement is None and not run.measures


def test_missing_scores_and_a_gate_on_token_rewards_are_refused() -> None:
    s = step(0)
    with pytest.raises(CreditError, match="needs direction_scores, rewards and groups"):
        red_run().apply(
            s["advantages"], s["mask"], s["ids"], CreditSignals(prefix_rewards=s["prefix"])
        )
    paper = CreditPlan.build(get_strategy({"name": "red", "mode": "paper"}), BACKEND)
    with pytest.raises(CreditError, match=r"credit\.gate: strategy .red. gives no mean-preserving"):
        CreditRun(paper, GATE)


def test_no_group_measured_leaves_the_alpha_at_zero() -> None:
    run = red_run(GATE)
    s = step(0)
    s["rewards"] = torch.ones_like(s["rewards"])
    out = apply(run, s)
    assert out.agreement is not None
    assert (out.agreement.groups, out.agreement.skipped) == (0, GROUPS)
    assert math.isnan(out.agreement.value) and out.agreement.alpha == 0.0
    assert math.isnan(out.agreement.to_dict()["credit/direction_agreement_ema"])
    assert torch.equal(
        out.result.token_advantages,
        gate_token_advantages(plain_credit(run, s), s["advantages"], s["mask"], 0.0),
    )


ON_ATTRIBUTION = GateConfig(agreement=(-0.5, 0.8), decay=0.7, measure="attribution")


def attribution_step(seed: int) -> dict[str, torch.Tensor]:
    """``step`` with a reward attribution (B, T) whose padding holds junk, which must not
    count."""
    s = step(seed)
    gen = torch.Generator().manual_seed(100 + seed)
    attribution = torch.randn(s["mask"].shape, generator=gen)
    s["attribution"] = torch.where(s["mask"], attribution, torch.tensor(1e6))
    return s


def attributed(s: dict[str, torch.Tensor]) -> CreditSignals:
    """red's prefix rewards and the step's reward attribution (which only a gate reads)."""
    return CreditSignals(prefix_rewards=s["prefix"], reward_attribution=s["attribution"])


def brute_spearman(values: torch.Tensor, rewards: torch.Tensor, groups: torch.Tensor) -> float:
    """Mean over groups with varying reward of scipy's Spearman rho, one group at a time."""
    from scipy.stats import spearmanr

    rhos = []
    for g in groups.unique():
        v, r = values[groups == g].numpy(), rewards[groups == g].numpy()
        if len(set(r.tolist())) > 1:
            rhos.append(0.0 if len(set(v.tolist())) == 1 else float(spearmanr(v, r).statistic))
    return sum(rhos) / len(rhos)


def test_a_gate_on_attribution_asks_the_backend_for_it_and_keeps_it_from_the_strategy() -> None:
    plan = CreditPlan.build(CreditConfig.parse({"name": "red", "gate": ON_ATTRIBUTION}), BACKEND)
    assert plan.gate_signals == {"reward_attribution"}
    assert plan.signals == {"prefix_rewards", "reward_attribution"}
    p2t = {"name": "p2t", "gate": ON_ATTRIBUTION}  # reads it itself: nothing only the gate reads
    assert CreditPlan.build(CreditConfig.parse(p2t), BACKEND).gate_signals == frozenset()
    scored = CreditPlan.build(CreditConfig.parse({"name": "red", "gate": GATE}), BACKEND)
    assert scored.signals == {"prefix_rewards"} and scored.gate_signals == frozenset()


def test_the_attribution_agreement_is_spearman_of_the_summed_attribution_per_group() -> None:
    run = CreditRun.build(CreditConfig.parse("p2t"), BACKEND)  # reads the attribution itself
    for seed in range(3):
        s = attribution_step(seed)
        out = apply(run, s, CreditSignals(reward_attribution=s["attribution"]))
        summed = torch.where(s["mask"], s["attribution"], 0.0).sum(1)
        assert out.agreement is not None and out.agreement.attribution is not None
        want = brute_spearman(summed, s["rewards"], s["groups"])
        assert out.agreement.attribution == pytest.approx(want, abs=1e-12)
        assert out.agreement.to_dict()["credit/attribution_agreement"] == out.agreement.attribution


def test_the_gate_on_attribution_mixes_by_the_ema_of_the_attribution_agreement() -> None:
    run = red_run(ON_ATTRIBUTION)
    ema = None
    for seed in range(5):
        s = attribution_step(seed)
        out = apply(run, s, attributed(s))
        summed = torch.where(s["mask"], s["attribution"], 0.0).sum(1)
        value = direction_agreement(summed, s["rewards"], s["groups"]).value
        ema = value if ema is None else 0.7 * ema + (1 - 0.7) * value
        alpha = min(1.0, max(0.0, (ema + 0.5) / 1.3))
        assert out.agreement is not None
        assert (out.agreement.ema, out.agreement.alpha) == (ema, alpha)
        score = direction_agreement(s["scores"], s["rewards"], s["groups"]).value
        assert out.agreement.value == score  # the score agreement is still reported
        want = gate_token_advantages(plain_credit(run, s), s["advantages"], s["mask"], alpha)
        assert torch.equal(out.result.token_advantages, want)
        metrics = out.agreement.to_dict()
        assert metrics["credit/attribution_agreement_ema"] == ema
        assert "credit/direction_agreement_ema" not in metrics


def test_a_gate_on_attribution_serves_a_direction_model_that_is_the_reward() -> None:
    run = red_run(ON_ATTRIBUTION, direction_is_reward=True)
    out = apply(run, attribution_step(0), attributed(attribution_step(0)))
    assert out.agreement is not None and out.agreement.direction_is_reward
    metrics = out.agreement.to_dict()
    assert "credit/direction_agreement" not in metrics
    assert metrics["credit/gate_alpha"] == out.agreement.alpha
    assert math.isfinite(metrics["credit/attribution_agreement"])


def test_a_gate_on_attribution_is_refused_where_it_cannot_be_measured() -> None:
    s = step(0)
    with pytest.raises(CreditError, match=r"needs signals\.reward_attribution"):
        apply(red_run(ON_ATTRIBUTION), s)
    with pytest.raises(CreditError, match=r"credit\.gate\.measure: 'attribution' ranks the step"):
        red_run(ON_ATTRIBUTION, measures_apart=True)
    plain_plan = CreditPlan.build(CreditConfig.parse("red"), BACKEND)
    with pytest.raises(CreditError, match="which the plan does not compute"):
        CreditRun(plain_plan, ON_ATTRIBUTION)
    bad = attribution_step(0)
    bad["attribution"][0, 0] = math.nan
    with pytest.raises(CreditError, match="reward_attribution: expected finite values"):
        apply(red_run(ON_ATTRIBUTION), bad, attributed(bad))


def test_a_bf16_attribution_is_summed_in_float64_as_its_float32_copy() -> None:
    """A bf16 direction model gives a bf16 attribution: its agreement is that of the same
    values in float32 (the sum is taken in float64, no bf16 accumulation)."""
    s = attribution_step(3)
    s["attribution"] = torch.where(s["mask"], s["attribution"], 0.0).bfloat16()
    half = apply(red_run(ON_ATTRIBUTION), s, attributed(s)).agreement
    s["attribution"] = s["attribution"].float()
    full = apply(red_run(ON_ATTRIBUTION), s, attributed(s)).agreement
    assert half is not None and full is not None and half.attribution is not None
    assert half.attribution == full.attribution and half.alpha == full.alpha
