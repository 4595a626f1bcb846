"""The native trainer with a reward function that returns per-step rewards (``reward: {kind:
callable}``; docs/design.md, "User-given token rewards (process supervision)"): the spans
reach ``process`` as the token-rewards signal and the token advantages the update reads are
the hand formula on the step's batch; a mismatch between the function and the strategy is
one ``ConfigError``. A process reward model (``reward: {kind: prm}``) trains ``process`` on
its step scores the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from adapters.scorers import CallableScorer, PRMScorer, RewardSignals
from adapters.tiny import train_bpe_tokenizer
from backends.common.errors import ConfigError
from backends.torch.config import config_from_dict
from backends.torch.credit import CreditPath
from backends.torch.rollout_rewards import RolloutRewards
from backends.torch.step import StepSignals
from backends.torch.trainer import GRPORecipe, train
from credit_core import TokenRewards, get_strategy
from tests.helpers.process_formula import halves, halves_process
from tests.helpers.torch_tiny import tiny_config

pytestmark = pytest.mark.usefixtures("single_torch_thread")

STEP_REWARD = "tests.backends.torch.test_token_rewards:step_reward"
EPS = 1e-6
#: The positional task's reward model as a PRM (a ``kind: module`` factory), a step ending at
#: each token whose text holds a space (most of the tiny BPE's word tokens).
PRM_MODEL = {
    "kind": "module",
    "factory": "tests.backends.torch.test_credit_run:weak_direction",
    "factory_kwargs": {"seed": 0},
}
PRM = {"kind": "prm", "model": PRM_MODEL, "step_separator": " "}


spans_of = halves


def step_reward(
    prompts: list[str], responses: list[str], response_ids: list[list[int]]
) -> list[Any]:
    """Per-step rewards: (start, end, reward) spans of each response's token positions."""
    return [spans_of(ids) for ids in response_ids]


def hand_formula(
    ids: torch.Tensor, mask: torch.Tensor, group_size: int, outcome_weight: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(R, A): ``process`` on the native GRPO advantage (tests/helpers/process_formula.py)."""
    return halves_process(ids, mask, group_size, outcome_weight, EPS)


def test_per_step_rewards_train_two_steps_with_the_hand_formula_s_token_advantages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[StepSignals] = []
    real = CreditPath.signals

    def spy(self: CreditPath, *args: Any, **kwargs: Any) -> StepSignals:
        out = real(self, *args, **kwargs)
        seen.append(out)
        return out

    monkeypatch.setattr(CreditPath, "signals", spy)
    cfg = tiny_config(
        tmp_path / "run",
        steps=2,
        credit={"name": "process", "outcome_weight": 0.5},
        reward={"reward": {"kind": "callable", "function": STEP_REWARD}},
        algorithm={"micro_batch_size": 4},  # the token rewards of two micro-batches joined
    )
    result = train(config_from_dict(cfg))
    assert [int(r["step"]) for r in result.history if "reward/mean" in r] == [1, 2]
    assert len(seen) == 2
    for signals in seen:
        batch = signals.batch
        mask = batch.response_mask.bool()
        R, A = hand_formula(batch.response_ids, mask, 4, 0.5)
        torch.testing.assert_close(signals.rewards, R.float())
        token_adv = signals.credit.token_advantages
        torch.testing.assert_close(token_adv, A.float(), rtol=1e-5, atol=1e-6)
        assert bool((token_adv != A[:, :1].float()).any())  # not one advantage per response


def test_a_prm_s_step_scores_train_process_with_advantages_that_change_at_step_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``reward: {kind: prm}``: R is the PRM's score of the whole response; ``process``'s
    token advantages are finite, vary within responses and change only after a step's end
    (the sum to go of the normalised step scores, outcome weight 0)."""
    from tests.backends.torch.test_credit_run import weak_direction

    seen: list[StepSignals] = []
    real = CreditPath.signals

    def spy(self: CreditPath, *args: Any, **kwargs: Any) -> StepSignals:
        out = real(self, *args, **kwargs)
        seen.append(out)
        return out

    monkeypatch.setattr(CreditPath, "signals", spy)
    cfg = tiny_config(tmp_path / "run", steps=2, credit="process", reward={"reward": PRM})
    result = train(config_from_dict(cfg))
    assert [int(r["step"]) for r in result.history if "reward/mean" in r] == [1, 2]
    prm = PRMScorer(weak_direction(0), train_bpe_tokenizer(vocab_size=512), " ")
    varies = 0
    for signals in seen:
        b = signals.batch
        whole = prm.model.score(
            b.prompt_ids, b.prompt_mask, b.response_ids, b.response_mask, with_grad=False
        )
        torch.testing.assert_close(signals.rewards, whole.rewards.float())
        A = signals.credit.token_advantages
        assert bool(torch.isfinite(A).all())
        for row, ends in enumerate(prm.step_ends(b.response_ids, b.response_mask)):
            n = ends[-1] + 1
            changes = torch.nonzero(A[row, 1:n] != A[row, : n - 1]).flatten().tolist()
            assert set(changes) <= set(ends), (row, changes, ends)
            varies += bool(changes)
    assert varies > 0  # advantages that vary within some responses


def test_under_gae_the_critic_reads_the_step_rewards_as_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/design.md, "Credit under a critic": ``process``'s token rewards replace the
    outcome at the last token; with the defaults they are the function's step rewards."""
    from tests.backends.torch.test_train import GAE_UPDATES, _gae_handed

    reward = {"reward": {"kind": "callable", "function": STEP_REWARD}}
    cfg = tiny_config(tmp_path / "run", credit="process", reward=reward, **GAE_UPDATES)
    recipe = GRPORecipe(config_from_dict(cfg))
    try:
        batch, _, handed = _gae_handed(recipe, monkeypatch)
        mask = batch.response_mask.bool()
        expected = torch.zeros(mask.shape)
        for b in range(mask.shape[0]):
            for _, end, r in spans_of(batch.response_ids[b][mask[b]].tolist()):
                expected[b, end - 1] = r
        assert torch.equal(handed, expected)
    finally:
        recipe.close()


def test_a_function_and_a_strategy_that_do_not_match_are_one_config_error(
    tmp_path: Path,
) -> None:
    reward = {"reward": {"kind": "callable", "function": STEP_REWARD}}
    cfg = tiny_config(tmp_path / "a", steps=1, reward=reward)
    with pytest.raises(ConfigError, match=r"credit: strategy 'uniform' does not read token"):
        train(config_from_dict(cfg))
    cfg = tiny_config(tmp_path / "b", steps=1, credit="process")
    with pytest.raises(ConfigError, match=r"reward.reward: credit strategy 'process' reads the"):
        GRPORecipe(config_from_dict(cfg))


def test_process_with_a_function_that_returns_numbers_is_a_config_error() -> None:
    side = RolloutRewards(RewardSignals(CallableScorer(step_reward, None, name="pkg:fn")))
    with pytest.raises(ConfigError, match=r"'process' reads token rewards, but the reward "):
        side.token_rewards_for(get_strategy("process"), None)
    assert side.token_rewards_for(get_strategy("uniform"), None) is None


def test_a_prm_with_a_strategy_that_does_not_read_token_rewards_is_a_config_error() -> None:
    from tests.backends.torch.test_credit_run import weak_direction

    side = RolloutRewards(RewardSignals(PRMScorer(weak_direction(0), None, "\n")))
    given = TokenRewards.from_spans([[(0, 1, 1.0)]], torch.ones(1, 1, dtype=torch.bool))
    with pytest.raises(ConfigError, match=r"'uniform' does not read .* the process reward model"):
        side.token_rewards_for(get_strategy("uniform"), given)
    assert side.token_rewards_for(get_strategy("process"), given) is given
