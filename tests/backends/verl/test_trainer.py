"""``CreditPPOTrainer`` as verl builds it: picked by verl's trainer registry from
``trainer.v1.trainer_mode``, constructed on verl's composed config (no Ray needed for
that), then verl's synchronous trainer in every respect verl's own code checks."""

from __future__ import annotations

import pytest

pytest.importorskip("verl", reason="the verl tests run in .venv-verl (make verl)")

from omegaconf import OmegaConf
from verl.trainer.ppo.v1 import get_trainer_cls
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

from backends.verl.cli import checked_config, verl_overrides
from backends.verl.config import TRAINER_MODE
from backends.verl.trainer import CreditPPOTrainer
from credit_core import CreditError
from tests.backends.verl.test_gpu_smoke import settings


def smoke_config(*extra: str):
    found = settings()
    overrides = verl_overrides([*found["VERL_COMMON"], *found["VERL_DATC"], *extra])
    config = checked_config([*overrides, f"trainer.v1.trainer_mode={TRAINER_MODE}"])
    OmegaConf.resolve(config)  # as verl's TaskRunner does before building the trainer
    return config


def test_verl_builds_the_credit_trainer_as_its_sync_trainer() -> None:
    config = smoke_config()
    trainer = get_trainer_cls(config.trainer.v1.trainer_mode)(config=config)
    assert type(trainer) is CreditPPOTrainer
    assert trainer.trainer_mode == "sync" and type(trainer.replay_buffer) is ReplayBuffer
    assert trainer.credit.credit.name == "datc" and trainer.credit.needs_work
    assert trainer.strategy.name == "datc"


def test_a_bad_credit_key_stops_the_trainer_before_any_worker() -> None:
    config = smoke_config()
    config.algorithm.credit = "red"
    with pytest.raises(CreditError, match="'red' is not served"):
        CreditPPOTrainer(config=config)
