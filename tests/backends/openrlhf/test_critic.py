"""PPO with a critic under OpenRLHF (``--algo.advantage.estimator gae``), through OpenRLHF's
real ``compute_advantages_and_returns`` (docs/design.md, "Credit under a critic";
docs/openrlhf.md, "PPO with a critic").

The strategy's credit is a shift D of the token rewards OpenRLHF builds (the outcome reward
at the last action token plus its KL penalty), added where they enter OpenRLHF's
``get_advantages_and_returns``; OpenRLHF's GAE, whitening and critic values are its own.
``uniform`` is stock OpenRLHF bit for bit; the weights form (``datc``) moves each response's
group deviation of the reward between its tokens, keeping its sum; ABC's paper form hands
its own r_t = beta R alpha_t + (1 - beta) R 1[t = T]. The signals come from in-process
actors (``PolicyHost`` around a real OpenRLHF ``Actor``, ``LocalGroup``), and every expected
D is recomputed independently: datc's from the same maker's GRPO token advantages on the
same rollouts, ABC's from the direction model's attention on each plain prompt | response.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import ray
import torch

from backends.openrlhf.compat import ResolvedCredit, resolve_credit
from backends.openrlhf.settings import OpenRLHFCreditConfig
from credit_core import CreditConfig, CreditError
from tests.backends.openrlhf.policy_host import LocalGroup, PolicyHost
from tests.backends.openrlhf.signal_direction import SignalDirectionModel
from tests.helpers.openrlhf import openrlhf_args, rollout_samples

pytestmark = pytest.mark.usefixtures("single_torch_thread")

VOCAB, DIM, RM_SEED = 79, 6, 3
N = 2  # samples per prompt
PROMPTS = [[3, 4, 5]] * 2 + [[6, 7]] * 2 + [[8, 9, 10, 11]] * 2 + [[12]] * 2
RESPONSES = [
    [20, 21, 22, 23],
    [24, 25],
    [26, 27, 28, 29, 30, 31],
    [32],
    [33, 34, 35],
    [36, 37, 38, 39, 40],
    [41, 42],
    [43, 44, 45, 46],
]
REWARDS = [1.0, 0.0, 0.5, 2.0, -1.0, 0.25, 0.3, 0.9]
COMMON = ["--rollout.n_samples_per_prompt", str(N), "--rollout.micro_batch_size", "3"]
#: PPO with a critic, the KL penalty in the reward (OpenRLHF's PPO default)
GAE = ["--algo.advantage.estimator", "gae", "--algo.kl.init_coef", "0.05", *COMMON]
GRPO = ["--algo.advantage.estimator", "group_norm", "--algo.kl.use_loss", *COMMON]
DIRECTION = {
    "kind": "module",
    "factory": "tests.backends.openrlhf.signal_direction:signal_direction_model",
    "factory_kwargs": {"vocab": VOCAB, "dim": DIM, "seed": RM_SEED},
}


@pytest.fixture(autouse=True)
def actors_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """``PolicyModelActor.forward`` on the CPU; ``ray.get`` of a ``LocalGroup``'s results."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    monkeypatch.setattr(ray, "get", lambda results: results)


@pytest.fixture
def handed(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """Every token-reward tensor OpenRLHF's own ``get_advantages_and_returns`` receives."""
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker

    seen: list[torch.Tensor] = []
    original = RemoteExperienceMaker.get_advantages_and_returns

    def spy(self: Any, values: Any, rewards: torch.Tensor, *args: Any) -> Any:
        seen.append(rewards.clone())
        return original(self, values, rewards, *args)

    monkeypatch.setattr(RemoteExperienceMaker, "get_advantages_and_returns", spy)
    return seen


def resolved(credit: Any, flags: list[str]) -> ResolvedCredit:
    return resolve_credit(
        openrlhf_args(flags),
        OpenRLHFCreditConfig(
            credit=CreditConfig.parse(credit), direction=DIRECTION, placement="policy"
        ),
    )


def stock_maker(flags: list[str]) -> Any:
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
    from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController

    args = openrlhf_args(flags)
    strategy = type("Strategy", (), {"args": args})()
    tokenizer = type("Tokenizer", (), {"pad_token_id": 0})()
    kl = FixedKLController(args.algo.kl.init_coef)
    return RemoteExperienceMaker(None, None, None, None, kl, strategy, tokenizer)


def credit_maker(flags: list[str], credit: ResolvedCredit, policy: Any) -> Any:
    from backends.openrlhf.experience_maker import TokenCreditExperienceMaker

    stock = stock_maker(flags)
    group = None if policy is None else LocalGroup(policy)
    return TokenCreditExperienceMaker(
        group, None, None, None, stock.kl_ctl, stock.strategy, stock.tokenizer, credit=credit
    )


def micro_batches(policy: PolicyHost | None) -> list[Any]:
    """The rollout split by OpenRLHF into micro-batches of 3, 3 and 2 (groups split across
    them), with what ``make_experience`` adds: the policy's log-probs (its forward, which
    keeps the credit's logits signals), a KL estimate, the critic's values."""
    batches = stock_maker(GAE).split_rollout_samples(rollout_samples(PROMPTS, RESPONSES, REWARDS))
    assert [len(b.sequences) for b in batches] == [3, 3, 2]
    logps = (
        policy.run("forward", batches)
        if policy is not None
        else [torch.zeros(b.action_mask.shape) for b in batches]
    )
    gen = torch.Generator().manual_seed(7)
    for exp, logp in zip(batches, logps, strict=True):
        exp.action_log_probs = logp
        exp.kl = torch.rand(exp.action_mask.shape, generator=gen) * exp.action_mask
        exp.values = torch.randn(exp.action_mask.shape, generator=gen)
    return batches


def test_uniform_under_gae_is_stock_openrlhf_bit_for_bit(handed: list[torch.Tensor]) -> None:
    credit = resolved("uniform", GAE)
    batches = micro_batches(None)
    stock = stock_maker(GAE).compute_advantages_and_returns(copy.deepcopy(batches))
    stock_rewards = list(handed)
    ours = credit_maker(GAE, credit, None).compute_advantages_and_returns(copy.deepcopy(batches))
    assert len(handed) == 2 * len(batches)
    for s, o, rs, ro in zip(stock, ours, stock_rewards, handed[len(batches) :], strict=True):
        assert torch.equal(ro, rs)
        assert torch.equal(o.advantages, s.advantages) and torch.equal(o.returns, s.returns)


def _grpo_token_advantages(credit: Any) -> list[torch.Tensor]:
    """The strategy's token advantages under OpenRLHF's GRPO on the same rollouts (its own
    tested path, tests/backends/openrlhf/test_baselines.py)."""
    policy = PolicyHost(VOCAB, seed=2, temperature=1.0)
    maker = credit_maker(GRPO, resolved(credit, GRPO), policy)
    batches = micro_batches(policy)
    for exp in batches:
        exp.kl = torch.zeros_like(exp.kl)  # GRPO: the KL is in the loss
    return [e.advantages for e in maker.compute_advantages_and_returns(batches)]


def _datc_shift(batches: list[Any]) -> list[torch.Tensor]:
    """D_t = (R_i - mean_g R) (w_t - 1) / n_i, w_t = A_t / A_i from datc's GRPO advantages."""
    grpo = _grpo_token_advantages("datc")
    out = []
    for exp, adv in zip(batches, grpo, strict=True):
        D = torch.zeros(exp.action_mask.shape, dtype=torch.float64)
        for b, i in enumerate(map(int, exp.index)):
            acts = exp.action_mask[b].bool()
            group = REWARDS[i - i % N : i - i % N + N]
            deviation = REWARDS[i] - sum(group) / N
            A_t = adv[b][acts].double()
            A_i = A_t.mean()  # datc keeps the mean: A_i
            D[b, acts] = deviation * (A_t / A_i - 1.0) / int(acts.sum())
        out.append(D.float())
    return out


def _abc_paper_shift(batches: list[Any]) -> list[torch.Tensor]:
    """D_t = beta R alpha_t + (1 - beta) R 1[t = T] - R 1[t = T], beta = 0.5, alpha the
    direction model's attention on the plain prompt | response."""
    reference = SignalDirectionModel(VOCAB, DIM, seed=RM_SEED)
    out = []
    for exp in batches:
        D = torch.zeros(exp.action_mask.shape, dtype=torch.float64)
        for b, i in enumerate(map(int, exp.index)):
            prompt, response = PROMPTS[i], RESPONSES[i]
            ids, P = torch.tensor([prompt + response]), len(prompt)
            mask = torch.ones_like(ids)
            alpha = reference.score(
                ids[:, :P], mask[:, :P], ids[:, P:], mask[:, P:], with_grad=False,
                with_attention=True,
            ).attention[0].double()  # fmt: skip
            R = REWARDS[i]
            r = 0.5 * R * alpha
            r[-1] += 0.5 * R - R
            D[b, P - 1 : P - 1 + len(response)] = r
        out.append(D.float())
    return out


def _p2t_paper_shift(batches: list[Any]) -> list[torch.Tensor]:
    """D_t = r_t - R 1[t = T], r_t = (e_t - 0) . g_t P2T's attribution (null zero) of the
    direction model's gradient on the plain prompt | response (``DirectionModel.attribution``);
    its sum is not R (the paper form's own token rewards)."""
    reference = SignalDirectionModel(VOCAB, DIM, seed=RM_SEED)
    out = []
    for exp in batches:
        D = torch.zeros(exp.action_mask.shape, dtype=torch.float64)
        for b, i in enumerate(map(int, exp.index)):
            prompt, response = PROMPTS[i], RESPONSES[i]
            ids, P = torch.tensor([prompt + response]), len(prompt)
            mask = torch.ones_like(ids)
            g = reference.score(ids[:, :P], mask[:, :P], ids[:, P:], mask[:, P:], with_grad=True)
            assert g.reward_grad is not None
            r = reference.attribution(g.reward_grad, ids[:, P:], mask[:, P:], "zero")[0]
            r = r.double()
            r[-1] -= REWARDS[i]
            D[b, P - 1 : P - 1 + len(response)] = r
        out.append(D.float())
    return out


@pytest.mark.parametrize(
    ("credit", "expected_shift"),
    [
        ("datc", _datc_shift),
        ({"name": "abc", "mode": "paper"}, _abc_paper_shift),
        ({"name": "p2t", "mode": "paper", "null": "zero"}, _p2t_paper_shift),
    ],
    ids=["datc", "abc_paper", "p2t_paper"],
)
def test_a_strategy_under_gae_adds_its_shift_to_openrlhfs_token_rewards(
    handed: list[torch.Tensor], credit: Any, expected_shift: Any
) -> None:
    policy = PolicyHost(VOCAB, seed=2, temperature=1.0)
    resolved_credit = resolved(credit, GAE)
    assert resolved_credit.plan.strategy.critic_reward_form is not None
    maker = credit_maker(GAE, resolved_credit, policy)
    batches = micro_batches(policy)
    stock = stock_maker(GAE).compute_advantages_and_returns(copy.deepcopy(batches))
    stock_rewards = list(handed)
    handed.clear()
    ours = maker.compute_advantages_and_returns(copy.deepcopy(batches))
    assert len(handed) == len(batches)
    shifts = expected_shift(batches)
    assert max(float(D.abs().max()) for D in shifts) > 1e-3  # the strategy moved reward
    reference = stock_maker(GAE)
    gae = reference.strategy.args.algo.advantage
    rows = zip(batches, stock, ours, stock_rewards, list(handed), shifts, strict=True)
    for exp, s, o, rs, ro, D in rows:
        acts = exp.action_mask.bool()
        # OpenRLHF's token rewards (its outcome reward and KL penalty) plus D, nothing else
        torch.testing.assert_close(ro, rs + D, rtol=0, atol=1e-6)
        assert torch.equal(ro[~acts], rs[~acts])
        if expected_shift is not _p2t_paper_shift:
            # the sum-preserving contract: each response's total reward is OpenRLHF's (the
            # paper form of p2t hands its own r_t, whose sum is not R)
            torch.testing.assert_close(ro.sum(dim=1), rs.sum(dim=1), rtol=0, atol=1e-5)
        # OpenRLHF's GAE on them; the critic's values as they were
        _, want_returns = reference.get_advantages_and_returns(
            exp.values, ro, exp.action_mask, gae.gamma, gae.lambd
        )
        torch.testing.assert_close(o.returns, want_returns, rtol=0, atol=1e-6)
        assert not torch.allclose(o.returns, s.returns)
        assert "credit/weight_entropy" in o.info
        # issue 46: the separate direction model's agreement with the clipped reward, over
        # the step's 4 groups of 2 (split across the micro-batches), the same in each
        assert o.info["credit/direction_is_reward"].tolist() == [0.0] * len(o.sequences)
        assert o.info["credit/agreement_groups"].tolist() == [4.0] * len(o.sequences)
        agreement = o.info["credit/direction_agreement"]
        assert bool(agreement.isfinite().all()) and agreement.unique().numel() == 1
    assert len({float(o.info["credit/direction_agreement"][0]) for o in ours}) == 1
    # OpenRLHF's whitening over the step: mean 0, variance 1 over the action tokens
    adv = torch.cat([o.advantages[o.action_mask.bool()] for o in ours])
    assert float(adv.mean()) == pytest.approx(0.0, abs=1e-5)
    assert float(adv.var(unbiased=False)) == pytest.approx(1.0, abs=1e-4)


def test_what_stays_refused_under_gae_and_why() -> None:
    with pytest.raises(CreditError) as info:
        resolved("ktae", GAE)
    text = str(info.value)
    assert "--algo.advantage.estimator: 'gae'; credit strategy 'ktae' has no token-reward " in text
    with pytest.raises(CreditError, match=r"--rollout.n_samples_per_prompt: 1; under a critic"):
        resolved("datc", [*GAE, "--rollout.n_samples_per_prompt", "1"])
    # under GRPO the KL penalty in the reward still splits nothing per response
    with pytest.raises(CreditError, match=r"--algo.kl.init_coef > 0 without --algo.kl.use_loss"):
        resolved("datc", ["--algo.advantage.estimator", "group_norm", *COMMON])
