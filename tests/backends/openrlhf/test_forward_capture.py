"""The credit signals come from OpenRLHF's own log-prob forward: a DATC step runs exactly as
many policy forwards as stock OpenRLHF.

The host stands in for a live policy actor with OpenRLHF's real ``PolicyModelActor.forward``
and ``execute_batch`` (the functions of its Ray class) around a real ``openrlhf.models.Actor``;
``torch.cuda.current_device`` is pointed at the CPU for the test. Forwards are counted on the
Hugging Face model inside the ``Actor``.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from backends.openrlhf.actor_side import (
    ActorCreditState,
    ActorSignals,
    bind_credit_methods,
    reduce_policy_stats,
    reward_grad_for_actions,
    signals_method,
)
from backends.openrlhf.compat import BACKEND, ResolvedCredit, resolve_credit
from backends.openrlhf.forward_capture import CaptureStore, keeping_logits
from backends.openrlhf.settings import OpenRLHFCreditConfig
from credit_core import CreditConfig, token_work
from credit_core.plan import CreditPlan
from tests.backends.openrlhf.policy_host import PolicyHost
from tests.helpers.openrlhf import TinyDirectionModel, openrlhf_args, rollout_samples

pytestmark = pytest.mark.usefixtures("single_torch_thread")

VOCAB, DIM = 83, 6
PROMPTS = [[3, 4, 5], [3, 4, 5], [6, 7], [6, 7], [8, 9, 10, 11], [8, 9, 10, 11]]
RESPONSES = [[20, 21, 22], [23], [24, 25, 26, 27], [28, 29], [30, 31], [32, 33, 34]]
REWARDS = [1.0, 0.0, 0.5, 2.0, -1.0, 0.25]
FLAGS = [
    "--algo.advantage.estimator",
    "group_norm",
    "--rollout.n_samples_per_prompt",
    "2",
    "--rollout.micro_batch_size",
    "4",
    "--algo.kl.use_loss",
]


@pytest.fixture(autouse=True)
def cpu_as_cuda_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")


def stock_maker() -> Any:
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
    from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController

    strategy = type("Strategy", (), {"args": openrlhf_args(FLAGS)})()
    tokenizer = type("Tokenizer", (), {"pad_token_id": 0})()
    return RemoteExperienceMaker(
        None, None, None, None, FixedKLController(0.0), strategy, tokenizer
    )


def micro_batches() -> list[Any]:
    """The rollout split into micro-batches of 4 and 2 by OpenRLHF itself."""
    return stock_maker().split_rollout_samples(rollout_samples(PROMPTS, RESPONSES, REWARDS))


def state_for(plan: frozenset[str], rm: TinyDirectionModel, on_policy: bool) -> ActorCreditState:
    return ActorCreditState(
        computes=plan if on_policy else plan - {"reward_grad"},
        direction={"kind": "module"} if on_policy else None,
        tokenizer=None,
        stats_chunk_size=16,
        direction_model=rm if on_policy else None,
        reward_embedding=None if on_policy else rm.reward_embedding,
    )


@pytest.mark.parametrize("placement", ["policy", "reward"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_a_datc_step_runs_as_many_policy_forwards_as_stock_openrlhf(
    placement: str, temperature: float
) -> None:
    batches = micro_batches()
    rm = TinyDirectionModel(VOCAB, DIM, seed=2)
    host = PolicyHost(VOCAB, seed=1, temperature=temperature)
    stock_logp = host.run("forward", batches)
    assert host.forwards == len(batches)  # stock OpenRLHF: one forward per micro-batch

    cfg = OpenRLHFCreditConfig(
        credit=CreditConfig.parse("datc"),
        direction={"kind": "module", "factory": "tests.helpers.openrlhf:tiny_direction_model"},
        placement=placement,  # type: ignore[arg-type]
    )
    flags = ["--reward.model_name_or_path", "/rm"] if placement == "reward" else []
    credit = resolve_credit(openrlhf_args([*FLAGS, *flags, "--rollout.temperature", "1"]), cfg)
    assert credit.placement == placement
    on_policy = placement == "policy"
    plan = frozenset({"unsigned_work"}) if on_policy else frozenset({"reward_grad", "policy_stats"})
    assert credit.requires == plan  # g first on the policy actors: W0, no PolicyStats
    bind_credit_methods(host, "policy", state_for(plan, rm, on_policy))

    host.forwards = 0
    logp = host.run("forward", batches)  # make_experience's log-prob forward
    signals: list[ActorSignals] = host.run(signals_method("policy"), batches)
    assert host.forwards == len(batches)  # ... and nothing more for the credit signals
    assert [s.extra_policy_forwards for s in signals] == [0] * len(batches)
    for got, want in zip(logp, stock_logp, strict=True):
        assert torch.equal(got, want)  # OpenRLHF's log-probs are untouched

    host.actor.eval()
    for batch, signal in zip(batches, signals, strict=True):
        seqs, acts, attn = batch.sequences, batch.action_mask, batch.attention_mask
        stats = reduce_policy_stats(host.actor, seqs, acts, attn, rm.reward_embedding)
        if on_policy:  # the current path's W0: PolicyStats and g, then token_work
            assert signal.policy_stats is None and signal.unsigned_work is not None
            grad, reward = reward_grad_for_actions(rm, seqs, attn, acts)
            want = token_work(stats, grad, None) * acts
            torch.testing.assert_close(signal.unsigned_work, want, rtol=1e-5, atol=1e-7)
            assert signal.direction_reward is not None
            torch.testing.assert_close(signal.direction_reward, reward)
            assert float(signal.unsigned_work[acts.bool()].abs().min()) > 0.0
        else:
            assert signal.policy_stats is not None and signal.unsigned_work is None
            for name in ("p_sampled", "p_sq", "m1", "m2", "sampled_emb"):
                got, want = getattr(signal.policy_stats, name), getattr(stats, name)
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    assert len(host._credit_states["policy"].captured) == 0  # type: ignore[attr-defined]


def test_without_a_seen_forward_the_signals_cost_one_counted_extra_forward() -> None:
    batches = micro_batches()
    rm = TinyDirectionModel(VOCAB, DIM, seed=3)
    host = PolicyHost(VOCAB, seed=4, temperature=1.0)
    plan = frozenset({"unsigned_work"})
    bind_credit_methods(host, "policy", state_for(plan, rm, on_policy=True))
    signals = host.run(signals_method("policy"), batches)
    assert host.forwards == len(batches)
    assert [s.extra_policy_forwards for s in signals] == [1] * len(batches)
    host.forwards = 0
    host.run("forward", batches)
    again = host.run(signals_method("policy"), batches)
    assert host.forwards == len(batches)
    assert [s.extra_policy_forwards for s in again] == [0] * len(batches)
    for a, b in zip(signals, again, strict=True):
        assert a.unsigned_work is not None and b.unsigned_work is not None
        torch.testing.assert_close(a.unsigned_work, b.unsigned_work, rtol=1e-6, atol=1e-8)


def test_binding_twice_wraps_the_stock_forward_once() -> None:
    rm = TinyDirectionModel(VOCAB, DIM, seed=5)
    host = PolicyHost(VOCAB, seed=6, temperature=1.0)
    plan = frozenset({"unsigned_work"})
    bind_credit_methods(host, "policy", state_for(plan, rm, on_policy=True))
    bind_credit_methods(host, "policy", state_for(plan, rm, on_policy=True))
    batches = micro_batches()
    host.run("forward", batches)
    assert host.forwards == len(batches)
    assert len(host._credit_states["policy"].captured) == len(batches)  # type: ignore[attr-defined]


def test_datc_advantages_from_captured_w0_equal_the_policy_stats_path() -> None:
    """Through the experience maker: W0 taken from the log-prob forward gives the same token
    advantages as PolicyStats + g from a separate forward (the previous path)."""
    from backends.openrlhf.experience_maker import TokenCreditExperienceMaker

    rm = TinyDirectionModel(VOCAB, DIM, seed=7)
    host = PolicyHost(VOCAB, seed=8, temperature=1.0)
    batches = micro_batches()
    cfg = OpenRLHFCreditConfig(credit=CreditConfig.parse({"name": "datc", "beta": 2.0}))
    stock = stock_maker()

    def make(plan: frozenset[str], gather: Any) -> Any:
        first = plan == {"unsigned_work"}  # g known before the policy's forward
        resolved = CreditPlan.build(cfg.credit, BACKEND, work_first=first)
        assert resolved.signals == plan
        credit = ResolvedCredit(cfg, resolved, "policy", {"kind": "test"}, 1, False)
        parts = (None, None, None, None, stock.kl_ctl, stock.strategy, stock.tokenizer)
        return TokenCreditExperienceMaker(*parts, credit=credit, gather_signals=gather)

    def previous_path(experiences: Any) -> list[ActorSignals]:
        out = []
        host.actor.eval()
        for e in experiences:
            s, a, m = e.sequences, e.action_mask, e.attention_mask
            stats = reduce_policy_stats(host.actor, s, a, m, rm.reward_embedding)
            grad, reward = reward_grad_for_actions(rm, s, m, a)
            out.append(ActorSignals(stats, grad, reward))
        return out

    bind_credit_methods(host, "policy", state_for(frozenset({"unsigned_work"}), rm, True))
    for exp, logp in zip(batches, host.run("forward", batches), strict=True):
        exp.action_log_probs = logp
        exp.kl = torch.zeros_like(logp)
    base = stock.compute_advantages_and_returns(copy.deepcopy(batches))
    host.forwards = 0
    captured = make(
        frozenset({"unsigned_work"}), lambda exps: host.run(signals_method("policy"), exps)
    ).compute_advantages_and_returns(copy.deepcopy(batches))
    assert host.forwards == 0
    previous = make(
        frozenset({"reward_grad", "policy_stats"}), previous_path
    ).compute_advantages_and_returns(copy.deepcopy(batches))
    for got, want, plain in zip(captured, previous, base, strict=True):
        torch.testing.assert_close(got.advantages, want.advantages, rtol=1e-5, atol=1e-6)
        assert not torch.equal(got.advantages, plain.advantages)
        assert got.info["credit/extra_policy_forwards"].tolist() == [0.0] * len(got.sequences)


def test_keeping_logits_restores_the_actor_and_passes_other_calls_through() -> None:
    host = PolicyHost(VOCAB, seed=9, temperature=1.0)
    batch = micro_batches()[0]
    seen: list[tuple[int, ...]] = []
    with keeping_logits(host.actor, lambda z, *_: seen.append(tuple(z.shape))), torch.no_grad():
        logp, output = host.actor(
            batch.sequences, batch.action_mask, batch.attention_mask, return_output=True
        )
        plain = host.actor(batch.sequences, attention_mask=batch.attention_mask, return_output=True)
    assert seen == [(4, batch.sequences.shape[1], VOCAB)]  # only the call with an action mask
    assert logp.shape == batch.action_mask.shape and "logits" in output and "logits" in plain
    assert "forward" not in vars(host.actor)
    store: CaptureStore[int] = CaptureStore()
    store.put(batch.sequences, batch.action_mask, 1)
    store.put(batch.sequences + 1, batch.action_mask, 2)
    store.put(batch.sequences + 2, batch.action_mask, 3)
    assert store.take(batch.sequences + 1, batch.action_mask) == 2
    assert len(store) == 1  # the older, never collected entry is dropped
    assert store.take(batch.sequences, batch.action_mask) is None
