"""``model_seeds``: a run's seed also sets the policy's pretraining and the reward model's
training. Built for real at tiny sizes (2 pretraining steps, 2 RM steps): with it on, two
seeds get different cached folders (their specs name the seeds) holding different weights;
with it off, every seed gets the same folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ablations.ablation_config import AblateConfig
from ablations.results import RunKey
from ablations.runner import asset_key, build_assets
from ablations.settings import SettingAssets
from adapters.folder_cache import SPEC_FILE

TINY_TASK = {
    "num_train": 16,
    "num_held_out": 4,
    "num_pretrain": 32,
    "pretrain": {"steps": 2, "batch_size": 4},
    "rm": {"examples": 32, "steps": 2, "batch_size": 8, "hidden": 16},
}


def config(cache: Path, model_seeds: bool) -> AblateConfig:
    return AblateConfig.model_validate(
        {
            "strategies": ["uniform", "datc"],
            "settings": {"target_tokens": {"params": TINY_TASK}},
            "cache_dir": str(cache),
            "model_seeds": model_seeds,
        }
    )


def assets_of(cfg: AblateConfig, seed: int) -> SettingAssets:
    run = RunKey("target_tokens", "llama", "datc", seed)
    return build_assets(cfg, asset_key(cfg, run), log=lambda m: None)


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def rm_dir(assets: SettingAssets) -> Path:
    return Path(assets.reward["direction_model"]["path"])


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("seeded_cache")


def test_with_model_seeds_two_seeds_get_their_own_policy_and_reward_model(cache: Path) -> None:
    cfg = config(cache, model_seeds=True)
    zero, one = assets_of(cfg, 0), assets_of(cfg, 1)
    assert zero.policy_dir != one.policy_dir and rm_dir(zero) != rm_dir(one)
    assert not same(weights(zero.policy_dir), weights(one.policy_dir))
    assert not same(weights(rm_dir(zero)), weights(rm_dir(one)))
    # the cache keys name the seeds
    spec = json.loads((one.policy_dir / SPEC_FILE).read_text())
    assert spec["pretrain"]["seed"] == 1000
    assert json.loads((rm_dir(one) / SPEC_FILE).read_text())["rm"]["seed"] == 1000
    # the data are the task's, the same for every seed
    assert zero.data == one.data


def test_without_model_seeds_every_seed_shares_one_policy_and_reward_model(cache: Path) -> None:
    cfg = config(cache, model_seeds=False)
    zero, one = assets_of(cfg, 0), assets_of(cfg, 1)
    assert zero.policy_dir == one.policy_dir and rm_dir(zero) == rm_dir(one)
    # and seed 0 with model seeds on is that same shared model
    seeded_zero = assets_of(config(cache, model_seeds=True), 0)
    assert seeded_zero.policy_dir == zero.policy_dir
    assert same(weights(seeded_zero.policy_dir), weights(zero.policy_dir))
