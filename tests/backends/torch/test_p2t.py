"""P2T in the native trainer (docs/design.md, "Gradient x input attribution (P2T)").

- The token rewards come from the reward gradient of the one reward pass the trainer takes
  anyway: the credit equals ``p2t`` applied to r_t = (E[y_t] - e_null) . g_t computed here
  from that pass's gradient and the direction model's table, for every null it serves.
- Both modes train end to end (finite metrics, the gradient taken for every row).
- A null the direction model has no embedding for is refused at start-up, naming it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from backends.common.errors import ConfigError
from backends.torch.config import config_from_dict
from backends.torch.trainer import GRPORecipe, train
from credit_core import CreditSignals, assign_credit, get_strategy
from tests.backends.torch.test_baselines import _one_batch
from tests.helpers.torch_tiny import tiny_config

pytestmark = pytest.mark.usefixtures("single_torch_thread")


@pytest.mark.parametrize("null", ["pad", "zero"])
def test_the_credit_is_p2t_on_the_attribution_of_the_reward_pass_gradient(
    tmp_path: Path, null: str
) -> None:
    credit = {"name": "p2t", "null": null}
    recipe = GRPORecipe(config_from_dict(tiny_config(tmp_path / "run", credit=credit)))
    try:
        batch = _one_batch(recipe, 1.0)
        out = recipe.signals(batch, recipe.train_prompts)
        reward = recipe.reward.compute(batch, with_grad=True, micro_batch_size=8)
        assert reward.reward_grad is not None
        dm = recipe.reward.direction
        assert dm is not None
        E = dm.reward_embedding
        e_null = E[0] if null == "pad" else torch.zeros(E.shape[1])  # ModuleRM pads with id 0
        mask = batch.response_mask.bool()
        r = ((E[batch.response_ids] - e_null) * reward.reward_grad).sum(-1)
        r = torch.where(mask, r, 0.0)
        assert bool((r != 0).any())
        expected = assign_credit(
            get_strategy("p2t", **{"null": null}),
            out.advantages,
            mask,
            batch.response_ids,
            CreditSignals(reward_attribution=r),
        )
        torch.testing.assert_close(
            out.credit.token_advantages, expected.token_advantages, atol=1e-6, rtol=1e-5
        )
        assert out.reward_grad_rows == batch.size
    finally:
        recipe.close()


@pytest.mark.parametrize("credit", ["p2t", {"name": "p2t", "mode": "paper", "null": "zero"}])
def test_p2t_trains_end_to_end(tmp_path: Path, credit: Any) -> None:
    result = train(tiny_config(tmp_path / "run", steps=2, credit=credit))
    assert len(result.history) == 2
    for record in result.history:
        assert all(v == v for v in record.values()), record  # no NaN
        assert record["signals/reward_grad_rows"] > 0  # the attribution's gradient was taken


def test_a_null_the_direction_model_lacks_is_refused_at_start_up(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"'p2t' reads reward_attribution: null: 'unk'"):
        train(tiny_config(tmp_path / "run", credit={"name": "p2t", "null": "unk"}))
