"""P2T under OpenRLHF (docs/design.md, "Gradient x input attribution (P2T)"; docs/openrlhf.md):
the actors that take the reward gradient g turn it into r_t = (e_t - e_null) . g_t there and
ship only that (B, A) signal.

- With a direction model (either placement): r_t is ``DirectionModel.attribution`` of that
  model's own gradient on the same rows, from one scoring call per micro-batch (with grad),
  and the token advantages are ``assign_credit`` of ``p2t`` on it.
- On the one-pass path (OpenRLHF's reward model on its actors): one RM forward and one
  backward per micro-batch give OpenRLHF's reward (bitwise) and r_t, with x_t the RM's input
  embedding of the token and e_null its pad row (or zero); equal to a recomputation from the
  RM's own layers; no direction model is built.
- ``mode: paper`` reads the step's rewards and groups, which the maker hands it under GRPO
  and under ``gae``; a null the model lacks is refused when the maker is installed.

The actors run in-process as in ``test_baselines.py`` / ``test_one_pass.py``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import ray
import torch

from backends.openrlhf.compat import resolve_credit
from backends.openrlhf.settings import OpenRLHFCreditConfig
from credit_core import CreditConfig, CreditError, CreditSignals, assign_credit, get_strategy
from tests.backends.openrlhf.policy_host import PolicyHost, RewardHost
from tests.backends.openrlhf.signal_direction import SignalDirectionModel, path_direction_model
from tests.backends.openrlhf.test_baselines import (
    DIM,
    PROMPTS,
    RESPONSES,
    RM_FLAGS,
    RM_SEED,
    VOCAB,
    credit_maker,
    direction,
    micro_batches,
    resolved,
    stock_advantages,
    with_logprobs,
)
from tests.backends.openrlhf.test_one_pass import TEMPERATURE, openrlhf_reward_model
from tests.helpers.openrlhf import openrlhf_args

pytestmark = pytest.mark.usefixtures("single_torch_thread")


@pytest.fixture(autouse=True)
def actors_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """The actors' ``forward`` on the CPU; ``ray.get`` of a ``LocalGroup``'s results."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    monkeypatch.setattr(ray, "get", lambda results: results)


def embedding_direction() -> dict[str, Any]:
    """A ``ModuleRM`` direction model (a token table: pad is its row 0; no unk)."""
    factory = "tests.backends.openrlhf.signal_direction:path_direction_model"
    kwargs = {"vocab": VOCAB, "dim": DIM, "seed": RM_SEED}
    return {"kind": "module", "factory": factory, "factory_kwargs": kwargs}


def per_response(batches: list[Any]) -> list[tuple[int, int, int, int]]:
    """(micro-batch, row, prompt length, response length) of every response."""
    return [
        (k, b, len(PROMPTS[i]), len(RESPONSES[i]))
        for k, exp in enumerate(batches)
        for b, i in enumerate(map(int, exp.index))
    ]


def expected_credit(
    strategy: Any, advantage: torch.Tensor, r: torch.Tensor, ids: torch.Tensor
) -> torch.Tensor:
    """``assign_credit`` of ``strategy`` on one response's attribution ``r`` (1, R)."""
    mask = torch.ones_like(r, dtype=torch.bool)
    signals = CreditSignals(reward_attribution=r)
    return assign_credit(strategy, advantage.reshape(1), mask, ids, signals).token_advantages


@pytest.mark.parametrize("placement", ["policy", "reward"])
@pytest.mark.parametrize("null", ["pad", "zero"])
def test_the_attribution_is_the_direction_models_own_and_p2t_credits_it(
    placement: str, null: str
) -> None:
    batches = micro_batches()
    policy = PolicyHost(VOCAB, seed=2, temperature=1.0)
    credit = resolved(
        {"name": "p2t", "null": null},
        RM_FLAGS if placement == "reward" else [],
        direction=embedding_direction(),
        placement=placement,
    )
    assert credit.requires == {"reward_attribution"} and credit.placement == placement
    assert not credit.one_pass  # another direction model than OpenRLHF's reward model
    host = policy if placement == "policy" else PolicyHost(VOCAB, seed=4, temperature=1.0)
    maker = credit_maker(credit, policy, None if placement == "policy" else host)
    policy.forwards = 0
    batches = with_logprobs(batches, policy.run("forward", batches))
    signals = list(maker._gather_signals(batches))
    rm = host._credit_states[placement].direction_model
    rm.module.calls = 0
    out = maker.compute_advantages_and_returns(copy.deepcopy(batches))
    assert rm.module.calls == len(batches)  # one scoring call (with grad) per micro-batch
    assert policy.forwards == len(batches)  # the policy's own log-prob forwards only
    assert all(s.reward_grad is None for s in signals)  # only (B, A) crosses Ray

    # Independently, per response: the same model on the plain prompt | response, its
    # gradient turned into r_t by DirectionModel.attribution, credit_core's p2t.
    reference = path_direction_model(VOCAB, DIM, RM_SEED)
    strategy = get_strategy("p2t", null=null)
    advantages = stock_advantages(batches)
    for k, b, P, R in per_response(batches):
        i = int(batches[k].index[b])
        ids = torch.tensor([PROMPTS[i] + RESPONSES[i]])
        ones = torch.ones_like(ids)
        scored = reference.score(ids[:, :P], ones[:, :P], ids[:, P:], ones[:, P:], with_grad=True)
        assert scored.reward_grad is not None
        r = reference.attribution(scored.reward_grad, ids[:, P:], ones[:, P:], null)
        shipped = signals[k].reward_attribution
        assert shipped is not None
        torch.testing.assert_close(shipped[b, P - 1 : P - 1 + R], r[0], rtol=1e-5, atol=1e-6)
        assert float(shipped[b, P - 1 + R :].abs().sum()) == 0.0  # 0 off the action tokens
        want = expected_credit(strategy, advantages[k][b, P - 1], r, ids[:, P:])
        span = out[k].advantages[b, P - 1 : P - 1 + R]
        torch.testing.assert_close(span, want[0], rtol=1e-5, atol=1e-7)
    other = reference.attribution(scored.reward_grad, ids[:, P:], ones[:, P:], "zero")
    if null == "pad":  # the null matters: row 0 of the table is not zero
        assert not torch.allclose(r, other)


def test_p2t_takes_one_scoring_call_with_grad_per_micro_batch() -> None:
    """As DATC's gradient: one call of the direction model's ``score`` with grad, no
    attention or prefix passes (``SignalDirectionModel`` records every call)."""
    batches = micro_batches()
    policy = PolicyHost(VOCAB, seed=2, temperature=1.0)
    credit = resolved(
        {"name": "p2t", "null": "zero"}, [], direction=direction(), placement="policy"
    )
    maker = credit_maker(credit, policy)
    batches = with_logprobs(batches, policy.run("forward", batches))
    maker.compute_advantages_and_returns(copy.deepcopy(batches))
    rm = policy._credit_states["policy"].direction_model
    assert isinstance(rm, SignalDirectionModel)
    assert rm.requests == [(True, False, False)] * len(batches)


@pytest.mark.parametrize("null", ["pad", "zero"])
def test_one_pass_p2t_is_one_rm_forward_and_backward_and_equals_the_rms_own_layers(
    tmp_path: Path, null: str
) -> None:
    """OpenRLHF's reward model gives its reward (bitwise stock) and r_t = (x_t - e_null) . g_t
    from one forward and one backward per micro-batch; independently, per response: the RM's
    rows of the plain prompt | response through its transformer and value head, dR/dx by
    autograd, e_null its row of the tokenizer's pad id (0 here) or zero, credit_core's p2t."""
    batches = micro_batches()
    model = openrlhf_reward_model(tmp_path, torch.float32)
    with torch.no_grad():  # its pad row (padding_idx 0) starts at zero: make the null matter
        pad_row = model.get_input_embeddings().weight[0]
        pad_row.copy_(torch.randn(pad_row.shape, generator=torch.Generator().manual_seed(7)))
    reward = RewardHost(model)
    stock_rewards = reward.run(batches)
    credit = resolved({"name": "p2t", "null": null}, RM_FLAGS)
    assert credit.placement == "reward" and credit.one_pass
    assert credit.requires == {"reward_attribution"}
    policy = PolicyHost(VOCAB, seed=2, temperature=TEMPERATURE)
    maker = credit_maker(credit, policy, reward)
    reward.forwards = 0
    rewards = reward.run(batches)  # make_experience's reward dispatch, now one-pass
    assert (reward.forwards, reward.backwards) == (len(batches), len(batches))
    for got, want in zip(rewards, stock_rewards, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)  # OpenRLHF's reward, exactly
    batches = with_logprobs(batches, policy.run("forward", batches))
    state = reward._credit_states["reward"]
    assert all(entry.value.grad is None for entry in state.scored.entries)  # r_t kept, not g
    out = maker.compute_advantages_and_returns(copy.deepcopy(batches))
    assert (reward.forwards, reward.backwards) == (len(batches), len(batches))  # nothing more
    assert state.direction_model is None  # none was built
    assert policy.forwards == len(batches)

    table = model.get_input_embeddings().weight.detach()
    e_null = table[0] if null == "pad" else torch.zeros(table.shape[1])
    strategy = get_strategy("p2t", null=null)
    advantages = stock_advantages(batches)
    for k, b, P, R in per_response(batches):
        i = int(batches[k].index[b])
        ids = torch.tensor([PROMPTS[i] + RESPONSES[i]])
        x = table[ids].clone().requires_grad_(True)
        hidden = model.model(inputs_embeds=x).last_hidden_state
        score = (model.score(hidden)[0, -1, 0] - model.mean[0]) / model.std[0]
        (g,) = torch.autograd.grad(score, x)
        r = ((x.detach() - e_null) * g).sum(-1)[:, P:]
        want = expected_credit(strategy, advantages[k][b, P - 1], r, ids[:, P:])
        span = out[k].advantages[b, P - 1 : P - 1 + R]
        torch.testing.assert_close(span, want[0], rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(
            out[k].info["credit/direction_reward"][b], score.detach(), rtol=1e-5, atol=1e-6
        )
    if null == "pad":  # the pad row is not zero: the null changes r_t
        assert float((g * table[0]).sum().abs()) > 1e-6


def test_a_null_the_model_lacks_is_refused_when_the_maker_is_installed(tmp_path: Path) -> None:
    """``unk``: the direction model (a ``ModuleRM``, no tokenizer) and the one-pass reward
    model's tokenizer (no unk token here) have none; the refusal names the strategy, the
    signal and the null."""
    message = r"^--credit: strategy 'p2t' reads reward_attribution: null: 'unk' needs"
    policy = PolicyHost(VOCAB, seed=2, temperature=1.0)
    credit = resolved(
        {"name": "p2t", "null": "unk"}, [], direction=embedding_direction(), placement="policy"
    )
    with pytest.raises(CreditError, match=message):
        credit_maker(credit, policy)
    reward = RewardHost(openrlhf_reward_model(tmp_path, torch.float32))
    one_pass = resolved({"name": "p2t", "null": "unk"}, RM_FLAGS)
    assert one_pass.one_pass
    with pytest.raises(CreditError, match=message):
        credit_maker(one_pass, PolicyHost(VOCAB, seed=2, temperature=1.0), reward)


def test_the_paper_form_reads_the_steps_rewards_and_groups_under_grpo_and_gae() -> None:
    """The maker hands a strategy that reads the step's rewards and groups both under GRPO
    (its values: test_baselines.py, ``p2t_paper``) and under ``gae`` (test_critic.py), on the
    one-pass path too."""
    paper = {"name": "p2t", "mode": "paper"}
    grpo = resolved(paper, RM_FLAGS)
    assert grpo.requires == {"reward_attribution"} and grpo.plan.reads_groups
    assert grpo.one_pass
    gae = ["--algo.advantage.estimator", "gae", "--rollout.n_samples_per_prompt", "2"]
    credit = resolve_credit(
        openrlhf_args([*gae, *RM_FLAGS]),
        OpenRLHFCreditConfig(credit=CreditConfig.parse(paper)),
    )
    assert credit.requires == {"reward_attribution"} and credit.plan.reads_groups
    assert credit.one_pass
