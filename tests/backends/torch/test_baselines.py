"""The published baselines in the native trainer (docs/design.md, "Baselines").

- ``entropy_top``: the entropy comes from the old policy's own streamed LM-head pass (no
  extra forward: as many policy forwards as ``uniform``), at the rollout temperature, and
  equals the full-softmax entropy of a plain forward; the selection is the step's (1 - rho)
  quantile over every rank (``DistContext.gather_values``).
- A strategy's signals are computed only when it reads them.
- ``abc`` on a direction model without attention is refused at start-up, naming it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from adapters.direction import EmbeddingDirectionModel
from backends.common.errors import ConfigError
from backends.torch.config import config_from_dict
from backends.torch.distributed import DistContext
from backends.torch.trainer import GRPORecipe, train
from tests.helpers.torch_tiny import tiny_config

pytestmark = pytest.mark.usefixtures("single_torch_thread")

CREDIT = "backends.torch.credit"


def _one_batch(recipe: GRPORecipe, temperature: float) -> Any:
    prompts, positions, groups = recipe._my_prompts(
        recipe.sampler.next_batch(), recipe.train_prompts
    )
    return recipe.rollout(prompts, positions, groups, group_size=4, greedy=False, tag="t")


def test_entropy_top_selects_by_the_full_softmax_entropy_at_the_rollout_temperature(
    tmp_path: Path,
) -> None:
    cfg = tiny_config(
        tmp_path / "run", credit={"name": "entropy_top", "rho": 0.3}, rollout={"temperature": 0.7}
    )
    recipe = GRPORecipe(config_from_dict(cfg))
    try:
        batch = _one_batch(recipe, 0.7)
        out = recipe.signals(batch, recipe.train_prompts)
        ids = torch.cat([batch.prompt_ids, batch.response_ids], dim=1)
        mask = torch.cat([batch.prompt_mask.long(), batch.response_mask.long()], dim=1)
        with torch.no_grad():
            logits = recipe.policy.model(input_ids=ids, attention_mask=mask).logits.double()
        R = batch.response_len
        resp_logits = logits[:, -R - 1 : -1] / 0.7
        logp = torch.log_softmax(resp_logits, dim=-1)
        entropy = -(logp.exp() * logp).sum(-1)
        valid = batch.response_mask.bool()
        # left-padded prompts: the row's last prompt position predicts the first response token
        assert bool(mask[:, -R - 1].bool().all())
        tau = torch.quantile(entropy[valid], 0.7)
        selected = (entropy >= tau) & valid
        expected = torch.where(selected, out.advantages.unsqueeze(1).expand_as(valid), 0.0)
        torch.testing.assert_close(out.credit.token_advantages, expected.float())
        assert 0 < int(selected.sum()) < int(valid.sum())
    finally:
        recipe.close()


def _count_policy_forwards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, credit: Any
) -> tuple[int, dict[str, list[Any]]]:
    """Policy forwards of one training step (rollout excluded), and what was asked of the
    reward model and of the entropy kernel."""
    asked: dict[str, list[Any]] = {"score": [], "entropy": []}
    real_score = EmbeddingDirectionModel.score

    def spy_score(self: Any, *a: Any, **k: Any) -> Any:
        asked["score"].append(
            (k["with_grad"], k.get("with_attention", False), k.get("with_prefix_rewards", False))
        )
        return real_score(self, *a, **k)

    from backends.torch import credit as credit_module

    real_entropy = credit_module.response_logprobs_and_entropy

    def spy_entropy(*a: Any, **k: Any) -> Any:
        asked["entropy"].append(True)
        return real_entropy(*a, **k)

    monkeypatch.setattr(EmbeddingDirectionModel, "score", spy_score)
    monkeypatch.setattr(f"{CREDIT}.response_logprobs_and_entropy", spy_entropy)
    recipe = GRPORecipe(config_from_dict(tiny_config(tmp_path / "run", steps=1, credit=credit)))
    forwards = [0]
    real_rollout = recipe.rollout

    def rollout_without_counting(*a: Any, **k: Any) -> Any:
        handle.remove()
        try:
            return real_rollout(*a, **k)
        finally:
            register()

    def register() -> None:
        nonlocal handle
        handle = recipe.policy.model.register_forward_hook(
            lambda *_: forwards.__setitem__(0, forwards[0] + 1)
        )

    handle = recipe.policy.model.register_forward_hook(lambda *_: None)
    register()
    monkeypatch.setattr(recipe, "rollout", rollout_without_counting)
    try:
        recipe.run()
    finally:
        handle.remove()
        recipe.close()
    return forwards[0], asked


@pytest.mark.parametrize("credit", ["entropy_top", "random_top", "red", "ktae"])
def test_a_baseline_takes_as_many_policy_forwards_as_grpo_and_only_its_signals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, credit: str
) -> None:
    grpo, _ = _count_policy_forwards(tmp_path / "grpo", monkeypatch, "uniform")
    forwards, asked = _count_policy_forwards(tmp_path / credit, monkeypatch, credit)
    assert forwards == grpo > 0
    assert bool(asked["entropy"]) == (credit == "entropy_top")
    assert asked["score"], "the rewards are always scored"
    for with_grad, with_attention, with_prefix in asked["score"]:
        assert not with_grad and not with_attention
        assert with_prefix == (credit == "red")


@pytest.mark.parametrize("credit", ["datc_mid", {"name": "datc_ig", "points": 2}])
def test_a_path_gradient_strategy_takes_as_many_policy_forwards_as_grpo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, credit: Any
) -> None:
    """m1 comes from the old-policy pass (docs/design.md, "Curvature-robust direction"): no
    policy forward of its own."""
    grpo, _ = _count_policy_forwards(tmp_path / "grpo", monkeypatch, "uniform")
    forwards, asked = _count_policy_forwards(tmp_path / "path", monkeypatch, credit)
    assert forwards == grpo > 0
    assert asked["score"]  # rewards at the samples; the path gradient is taken beside them


def test_abc_is_refused_at_start_up_when_the_direction_model_has_no_attention(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigError, match=r"'abc' reads the direction model's attention.*ModuleRM"):
        train(tiny_config(tmp_path / "run", credit="abc"))


def _gather_worker(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        ctx = DistContext(rank, 2, rank, torch.device("cpu"), "gloo")
        mine = torch.arange(3 + 2 * rank, dtype=torch.float32) + 10 * rank
        torch.save(ctx.gather_values(mine), os.path.join(out_dir, f"rank{rank}.pt"))
        # a rank without a valid token takes part with an empty tensor of its own dtype
        mine = torch.arange(3, dtype=torch.float32) + 0.1 if rank == 0 else torch.zeros(0)
        nothing = ctx.gather_values(mine.double() if rank else mine)
        torch.save(nothing, os.path.join(out_dir, f"empty_rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_gather_values_joins_every_ranks_values_of_unequal_length_and_dtype_in_rank_order(
    tmp_path: Path,
) -> None:
    mp.start_processes(
        _gather_worker,
        args=(str(tmp_path / "init"), str(tmp_path)),
        nprocs=2,
        start_method="spawn",
    )
    expected = torch.cat([torch.arange(3.0), torch.arange(5.0) + 10])
    for rank in (0, 1):
        assert torch.equal(torch.load(tmp_path / f"rank{rank}.pt"), expected)
    values = torch.arange(3, dtype=torch.float32) + 0.1
    assert torch.equal(torch.load(tmp_path / "empty_rank0.pt"), values)
    assert torch.equal(torch.load(tmp_path / "empty_rank1.pt"), values.double())


@pytest.fixture(scope="module")
def bert_rm_setting(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Setting 1's assets at toy size: a word-level tiny policy and a tiny BERT reward model
    (a transformer with attention) trained in-process on the target-word rate."""
    from ablations.settings import TargetTokensParams, build_target_tokens

    params = TargetTokensParams.model_validate(
        {
            "num_train": 16,
            "num_held_out": 4,
            "num_pretrain": 32,
            "pretrain": {"steps": 2, "batch_size": 4},
            "rm": {"examples": 32, "steps": 2, "batch_size": 8, "hidden": 16},
        }
    )
    return build_target_tokens(params, "llama", tmp_path_factory.mktemp("assets"))


@pytest.mark.parametrize(
    "credit", ["abc", "red", {"name": "abc", "mode": "paper"}, {"name": "red", "mode": "paper"}]
)
def test_abc_and_red_train_with_a_transformer_reward_model(
    tmp_path: Path, bert_rm_setting: Any, credit: str | dict[str, str]
) -> None:
    from ablations.pretrain import TOKENIZER_DIR

    assets = bert_rm_setting
    cfg = tiny_config(
        tmp_path / "run",
        steps=2,
        credit=credit,
        reward=assets.reward,
        rollout={"group_size": 4, "prompts_per_step": 2, "max_new_tokens": 6},
    )
    cfg["policy"] = {
        "path": str(assets.policy_dir),
        "tokenizer": str(assets.policy_dir / TOKENIZER_DIR),
    }
    cfg["data"] = assets.data
    result = train(cfg)
    for record in result.history:
        assert all(v == v for v in record.values()), record  # no NaN
        assert record["signals/reward_grad_rows"] == 0  # neither takes the RM's gradient
    # the RM's attention / prefix rewards reached the credit: the weights are not uniform
    assert any(record["credit/weight_entropy"] < 1.0 for record in result.history)
