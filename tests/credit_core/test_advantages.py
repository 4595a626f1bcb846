"""Response-level advantage estimators: hand-computed values and OpenRLHF's own code.

``group_norm`` = (r - mean_g) / (std_g + eps) with Bessel's std, ``dr_grpo`` = r - mean_g,
``rloo`` = r - mean of the other G-1 rewards; rewards are ordered group by group.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from credit_core import ESTIMATORS, CreditBatch, CreditError, get_strategy, group_advantages
from tests.helpers.openrlhf_stubs import install_openrlhf_stubs


def test_estimator_names() -> None:
    assert set(ESTIMATORS) == {"group_norm", "dr_grpo", "rloo"}


def test_group_norm_by_hand() -> None:
    # Group [1, 2, 3, 4]: mean 2.5, Bessel variance (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3.
    # Group [0, 0, 1, 1]: mean 0.5, variance 4 * 0.25 / 3 = 1/3.
    rewards = torch.tensor([1.0, 2.0, 3.0, 4.0, 0.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    s1, s2 = math.sqrt(5 / 3), math.sqrt(1 / 3)
    expected = [-1.5 / s1, -0.5 / s1, 0.5 / s1, 1.5 / s1, -0.5 / s2, -0.5 / s2, 0.5 / s2, 0.5 / s2]
    got = group_advantages(rewards, 4, "group_norm", eps=0.0)
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64))
    with_eps = group_advantages(rewards, 4, eps=0.1)  # group_norm is the default
    torch.testing.assert_close(
        with_eps[:4], torch.tensor([-1.5, -0.5, 0.5, 1.5]).double() / (s1 + 0.1)
    )


def test_group_norm_pairs_and_constant_groups() -> None:
    # G = 2: [0, 1] has std sqrt(1/2), so A = -+0.5 / sqrt(1/2) = -+sqrt(1/2).
    got = group_advantages(torch.tensor([0.0, 1.0, 5.0, 5.0]), 2, eps=0.0 + 1e-6)
    h = math.sqrt(0.5)
    torch.testing.assert_close(got, torch.tensor([-h, h, 0.0, 0.0]), rtol=1e-5, atol=0)
    assert got[2:].tolist() == [0.0, 0.0]  # a group with equal rewards gets exactly 0


def test_dr_grpo_by_hand() -> None:
    rewards = torch.tensor([1.0, 2.0, 3.0, 4.0, 0.0, 0.0, 1.0, 1.0])
    got = group_advantages(rewards, 4, "dr_grpo")
    assert got.tolist() == [-1.5, -0.5, 0.5, 1.5, -0.5, -0.5, 0.5, 0.5]


def test_rloo_by_hand() -> None:
    # r_i minus the mean of the other three: 1 - 3, 2 - 8/3, 3 - 7/3, 4 - 2; and 0 - 2/3, ...
    rewards = torch.tensor([1.0, 2.0, 3.0, 4.0, 0.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    got = group_advantages(rewards, 4, "rloo")
    expected = [-2.0, -2 / 3, 2 / 3, 2.0, -2 / 3, -2 / 3, 2 / 3, 2 / 3]
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64))


def test_integer_rewards_give_float32() -> None:
    got = group_advantages(torch.tensor([0, 1, 1, 1]), 2, "dr_grpo")
    assert got.dtype == torch.float32 and got.tolist() == [-0.5, 0.5, 0.0, 0.0]


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_every_estimator_centers_each_group(estimator: str) -> None:
    rewards = torch.randn(5 * 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    got = group_advantages(rewards, 6, estimator).reshape(5, 6)
    torch.testing.assert_close(got.sum(dim=1), torch.zeros(5, dtype=torch.float64))


# ------------------------------------------------------------------ OpenRLHF's own code


def _openrlhf_token_advantages(
    estimator: str, group_size: int, rewards: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Token advantages from OpenRLHF 0.11.2's ``compute_advantages_and_returns``.

    That method of ``RemoteExperienceMaker`` (openrlhf/trainer/ppo_utils/experience_maker.py)
    is what its GRPO loop runs. Called on two ``Experience`` micro-batches (rows in original
    order) with no KL penalty, gamma = 1 and no length penalty, it returns the response
    advantage on every action token. Its ``self`` is a bare instance carrying the attributes
    the method reads.
    """
    install_openrlhf_stubs()
    from openrlhf.trainer.ppo_utils.experience import Experience
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker

    ns = SimpleNamespace
    args = ns(
        algo=ns(advantage=ns(estimator=estimator, gamma=1.0, lambd=1.0, no_std_norm=False)),
        rollout=ns(n_samples_per_prompt=group_size),
        reward=ns(clip_range=None, overlong_buffer_len=None, stop_properly_penalty_coef=None),
    )
    maker = RemoteExperienceMaker.__new__(RemoteExperienceMaker)
    maker.strategy, maker.args = ns(args=args), args
    maker.advantage_estimator, maker.kl_ctl = estimator, ns(value=0.0)
    half = len(rewards) // 2
    experiences = [
        Experience(
            rewards=rewards[rows].clone(),
            action_mask=mask[rows],
            kl=torch.zeros(len(rows), mask.shape[1], dtype=rewards.dtype),
            index=list(rows),
            info={},
        )
        for rows in (range(half), range(half, len(rewards)))
    ]
    done = RemoteExperienceMaker.compute_advantages_and_returns(maker, experiences)
    return torch.cat([e.advantages for e in done])


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize(("group_size", "n_prompts"), [(4, 3), (2, 2), (8, 1)])
def test_matches_openrlhf_compute_advantages_and_returns(
    estimator: str, group_size: int, n_prompts: int
) -> None:
    """Same response advantages as OpenRLHF's code, and uniform's tokens equal its tokens."""
    gen = torch.Generator().manual_seed(group_size * n_prompts)
    B = group_size * n_prompts
    rewards = torch.randn(B, generator=gen, dtype=torch.float64)
    rewards[:group_size] = 0.7  # a group with equal rewards (std 0)
    if n_prompts > 1:  # binary rewards, as from a verifier
        rewards[group_size : 2 * group_size] = (
            torch.rand(group_size, generator=gen) < 0.5
        ).double()
    mask = torch.arange(5).unsqueeze(0) < torch.randint(1, 6, (B, 1), generator=gen)

    theirs = _openrlhf_token_advantages(estimator, group_size, rewards, mask)
    ours = group_advantages(rewards, group_size, estimator, eps=1e-9)  # OpenRLHF: std + 1e-9
    torch.testing.assert_close(
        theirs, torch.where(mask, ours.unsqueeze(1), 0.0), rtol=1e-12, atol=1e-12
    )
    batch = CreditBatch(ours, mask, torch.zeros(mask.shape, dtype=torch.long))
    uniform = get_strategy("uniform").assign(batch)
    torch.testing.assert_close(uniform, theirs.float(), rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"rewards": torch.zeros(6), "group_size": 4},
            r"rewards: .*multiple of group_size=4, got 6",
        ),
        ({"rewards": torch.zeros(0), "group_size": 2}, r"rewards: .*positive multiple.*got 0"),
        (
            {"rewards": torch.zeros(4), "group_size": 1},
            r"group_size: expected an integer >= 2, got 1",
        ),
        ({"rewards": torch.zeros(4), "group_size": 2.0}, r"group_size: expected an integer >= 2"),
        (
            {"rewards": torch.zeros(2, 2), "group_size": 2},
            r"rewards: expected shape \(\*\), got \(2, 2\)",
        ),
        ({"rewards": [1.0, 2.0], "group_size": 2}, r"rewards: expected a torch.Tensor, got list"),
        (
            {"rewards": torch.tensor([0.0, float("nan"), 1.0, float("inf")]), "group_size": 2},
            r"rewards: expected finite values, entries \[1, 3\]",
        ),
        (
            {"rewards": torch.zeros(4), "group_size": 2, "estimator": "gae"},
            r"estimator: expected one of \['group_norm', 'dr_grpo', 'rloo'\], got 'gae'",
        ),
        ({"rewards": torch.zeros(4), "group_size": 2, "eps": -1e-3}, r"eps: expected a value >= 0"),
        ({"rewards": torch.zeros(4), "group_size": 2, "eps": float("nan")}, r"eps: expected"),
    ],
)
def test_errors_name_the_argument(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(CreditError, match=message):
        group_advantages(**kwargs)  # type: ignore[arg-type]
