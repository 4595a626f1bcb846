"""``datc_mid`` and ``datc_ig`` under OpenRLHF: the reward gradient on the path to the
policy's expected embeddings m1 (docs/design.md, "Curvature-robust direction"), with m1 from
OpenRLHF's own log-prob forward (no policy forward beyond stock OpenRLHF's), the direction
model on the policy actors or on the reward-model actors (m1 handed to them by the maker).

As in ``test_baselines.py``, the maker binds and gathers on in-process actors
(``PolicyHost``: OpenRLHF's own ``PolicyModelActor.forward`` and ``execute_batch`` around a
real ``Actor``) through ``LocalGroup``, Ray taken out; the expected token advantages are
recomputed independently per response from a plain forward of the policy
(``response_logprobs_and_stats``), ``adapters.grad_path.path_reward_grad`` on the plain
prompt | response and credit_core's strategy.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import ray
import torch

from adapters.grad_path import path_alphas, path_reward_grad
from adapters.policy import response_logprobs_and_stats
from backends.openrlhf.launcher import main
from credit_core import CreditBatch, CreditError, CreditStrategy, get_strategy
from tests.backends.openrlhf.policy_host import PolicyHost
from tests.backends.openrlhf.signal_direction import CurvedReward, path_direction_model
from tests.backends.openrlhf.test_baselines import (
    FLAGS,
    PROMPTS,
    RESPONSES,
    RM_FLAGS,
    VOCAB,
    credit_maker,
    micro_batches,
    resolved,
    stock_advantages,
    with_logprobs,
)
from tests.helpers.openrlhf import multi_turn_sample

pytestmark = pytest.mark.usefixtures("single_torch_thread")

DIM, RM_SEED, TEMPERATURE = 6, 13, 0.7
PATH_DIRECTION = {
    "kind": "module",
    "factory": "tests.backends.openrlhf.signal_direction:path_direction_model",
    "factory_kwargs": {"vocab": VOCAB, "dim": DIM, "seed": RM_SEED},
}


@pytest.fixture(autouse=True)
def actors_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """``PolicyModelActor.forward`` on the CPU; ``ray.get`` of a ``LocalGroup``'s results."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    monkeypatch.setattr(ray, "get", lambda results: results)


def expected_span(
    policy: PolicyHost, strategy: CreditStrategy, i: int, advantage: torch.Tensor
) -> torch.Tensor:
    """Response ``i``'s token advantages, recomputed alone: m1 from a plain forward of the
    policy at the rollout temperature, the gradient of the same direction model on the path
    (``strategy.reward_grad_points`` > 0) or at the samples (0), then ``strategy``."""
    points = strategy.reward_grad_points
    reference = path_direction_model(VOCAB, DIM, RM_SEED)
    prompt, response = PROMPTS[i], RESPONSES[i]
    ids, R, P = torch.tensor([prompt + response]), len(response), len(prompt)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        _, stats = response_logprobs_and_stats(
            policy.actor.model,
            ids,
            mask,
            R,
            temperature=TEMPERATURE,
            reward_embedding=reference.reward_embedding,
        )
    assert stats is not None
    if points:
        grad = path_reward_grad(
            reference,
            ids[:, :P],
            mask[:, :P],
            ids[:, P:],
            mask[:, P:],
            stats.m1,
            path_alphas(points),
        )
    else:
        grad = reference.score(ids[:, :P], mask[:, :P], ids[:, P:], mask[:, P:], with_grad=True)
        grad = grad.reward_grad
    batch = CreditBatch(
        advantages=advantage.reshape(1),
        mask=torch.ones(1, R, dtype=torch.bool),
        token_ids=ids[:, P:],
        reward_grad=grad,
        policy_stats=stats,
    )
    return strategy.assign(batch)[0]


@pytest.mark.parametrize("placement", ["policy", "reward"])
@pytest.mark.parametrize(
    ("credit", "points"), [("datc_mid", 1), ({"name": "datc_ig", "points": 3}, 3)]
)
def test_a_path_strategy_takes_m1_from_openrlhfs_forward_and_matches_a_recomputation(
    credit: Any, points: int, placement: str
) -> None:
    batches = micro_batches()
    policy = PolicyHost(VOCAB, seed=2, temperature=TEMPERATURE)
    stock_logp = policy.run("forward", batches)
    assert policy.forwards == len(batches)  # stock OpenRLHF: one forward per micro-batch

    flags = [*RM_FLAGS, "--rollout.temperature", str(TEMPERATURE)]
    resolved_credit = resolved(
        credit,
        flags if placement == "reward" else flags[2:],
        direction=PATH_DIRECTION,
        placement=placement,
    )
    assert resolved_credit.requires == {"policy_stats", "reward_grad"}
    assert resolved_credit.placement == placement and not resolved_credit.one_pass
    host = policy if placement == "policy" else PolicyHost(VOCAB, seed=4, temperature=1.0)
    maker = credit_maker(resolved_credit, policy, None if placement == "policy" else host)
    policy.forwards = 0
    batches = with_logprobs(batches, policy.run("forward", batches))  # make_experience's
    rm = host._credit_states[placement].direction_model  # built on the host at install
    assert isinstance(rm.module, CurvedReward)
    rm.module.calls = 0
    out = maker.compute_advantages_and_returns(copy.deepcopy(batches))
    assert policy.forwards == len(batches)  # ... and no policy forward for m1
    # the path's passes, and one no-grad forward at the samples for the direction model's
    # own score (the path gives none there), measured against the reward (issue 46)
    assert rm.module.calls == (points + 1) * len(batches)
    if placement == "reward":
        assert host.forwards == 0  # the reward-model host runs no policy forward either
    for exp, want in zip(batches, stock_logp, strict=True):
        assert torch.equal(exp.action_log_probs, want)  # OpenRLHF's log-probs are untouched

    strategy, datc = resolved_credit.plan.strategy, get_strategy("datc")
    assert strategy.reward_grad_points == points
    policy.actor.eval()
    moved = 0.0
    for exp, got, adv in zip(batches, out, stock_advantages(batches), strict=True):
        assert got.info["credit/extra_policy_forwards"].tolist() == [0.0] * len(exp.sequences)
        assert got.info["credit/direction_is_reward"].tolist() == [0.0] * len(exp.sequences)
        assert bool(got.info["credit/direction_agreement"].isfinite().all())
        assert float(got.advantages[~exp.action_mask.bool()].abs().max()) == 0.0
        for b, i in enumerate(map(int, exp.index)):
            P, R = len(PROMPTS[i]), len(RESPONSES[i])
            A = adv[b, P - 1]
            span = got.advantages[b, P - 1 : P - 1 + R]
            want = expected_span(policy, strategy, i, A)
            torch.testing.assert_close(span, want, rtol=1e-4, atol=1e-6)
            torch.testing.assert_close(span.double().mean(), A.double(), rtol=1e-5, atol=1e-6)
            at_samples = expected_span(policy, datc, i, A)
            moved = max(moved, float((want - at_samples).abs().max()))
    assert moved > 1e-3  # the path gradient is not the one at the samples: the test can fail


def test_a_direction_model_that_cannot_take_the_path_is_refused_at_install() -> None:
    """The path needs an EmbeddingDirectionModel reading the policy's ids: the maker builds the
    direction model on its host at install and refuses another one, naming why."""
    tiny = {
        "kind": "module",
        "factory": "tests.helpers.openrlhf:tiny_direction_model",
        "factory_kwargs": {"vocab": VOCAB, "dim": DIM, "seed": RM_SEED},
    }
    for placement in ("policy", "reward"):
        credit = resolved(
            "datc_mid",
            RM_FLAGS if placement == "reward" else [],
            direction=tiny,
            placement=placement,
        )
        policy = PolicyHost(VOCAB, seed=2, temperature=1.0)
        reward = None if placement == "policy" else PolicyHost(VOCAB, seed=4, temperature=1.0)
        with pytest.raises(CreditError) as info:
            credit_maker(credit, policy, reward)
        text = str(info.value)
        for fragment in (
            "'datc_mid' takes the reward gradient on the path",
            "must read input embeddings (an EmbeddingDirectionModel), got TinyDirectionModel",
        ):
            assert fragment in text


def test_on_a_multi_turn_sample_only_the_action_tokens_move_along_the_path() -> None:
    """m1 exists at the action tokens only: observation tokens stay at their embeddings (as
    the prompt does) and get no gradient; the action columns hold the path gradient of
    [prompt | response] with the action tokens moved to their m1."""
    from backends.openrlhf.actor_side import path_grad_for_actions
    from backends.openrlhf.layout import action_to_response_coords, split_prompt_response

    rm = path_direction_model(VOCAB, DIM, RM_SEED)
    sample = multi_turn_sample([3, 4], [([30, 31], True), ([40, 41, 42], False), ([32], True)], 1)
    seqs, attn, acts = sample.sequences, sample.attention_mask, sample.action_mask
    m1 = torch.randn(1, acts.shape[1], DIM, generator=torch.Generator().manual_seed(3))
    m1 = m1 * acts.unsqueeze(2)  # PolicyStats: 0 off the action tokens
    got = path_grad_for_actions(rm, seqs, attn, acts, m1, points=2)

    split = split_prompt_response(seqs, attn, acts)
    moved, is_action = action_to_response_coords(m1, split, acts)
    assert is_action.tolist() == [[True, True, False, False, False, True]]
    assert torch.equal(moved[0, [0, 1, 5]], m1[0, [1, 2, 6]])
    response = split.response_ids
    target = torch.where(is_action.unsqueeze(2), moved, rm.table[response])
    want = path_reward_grad(
        rm, split.prompt_ids, split.prompt_mask, response, split.response_mask, target, [0.25, 0.75]
    )
    torch.testing.assert_close(got[0, [1, 2, 6]], want[0, [0, 1, 5]].float())
    assert float(got[0, [0, 3, 4, 5]].abs().sum()) == 0.0
    # moving the observation tokens to m1 = 0 (as a plain m1 would) changes the gradient
    zeroed = path_reward_grad(
        rm, split.prompt_ids, split.prompt_mask, response, split.response_mask, moved, [0.25, 0.75]
    )
    assert float((zeroed[0, [0, 1, 5]] - want[0, [0, 1, 5]]).abs().max()) > 1e-4


class RayReachedError(Exception):
    """Raised by ``ray.init``: train_ppo_ray got past its parser and the credit check."""


def test_credit_openrlhf_accepts_datc_mid_and_datc_ig(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command line is parsed, then the real train_ppo_ray runs its parser and the credit
    check (``compat.resolve_credit``) and goes on to start Ray."""
    from backends.openrlhf import launcher

    seen: list[Any] = []
    for flags in (["--credit", "datc_mid"], ["--credit", "datc_ig", "--credit.points", "8"]):
        assert main([*flags, *FLAGS, *RM_FLAGS], train=lambda cfg, _: seen.append(cfg)) == 0
    assert [cfg.credit.name for cfg in seen] == ["datc_mid", "datc_ig"]
    assert get_strategy(seen[1].credit).reward_grad_points == 8

    def reached(*args: object, **kwargs: object) -> None:
        raise RayReachedError

    monkeypatch.setattr(ray, "init", reached)
    for flags in (
        ["--credit", "datc_mid"],
        ["--credit", "datc_mid", "--credit.placement", "policy"],
    ):
        cfg, argv = launcher.parse_command_line(
            [*flags, "--actor.model_name_or_path", "/models/policy", *FLAGS, *RM_FLAGS]
        )
        with pytest.raises(RayReachedError):
            launcher.train_with_credit(cfg, argv)
