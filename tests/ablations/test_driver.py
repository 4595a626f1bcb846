"""The ablation's training loop with evaluations (``ablations.driver``) on a tiny setting 5.

- Every evaluation record (steps 0, 1, 2) holds the trainer's held-out metrics and the
  credit probes, with the exact-credit correlation defined for DATC's credit.
- The probes never change the run: with ``datc_shuffled`` (a strategy with a random
  stream) and another credit compared on its batches (``datc`` with the midpoint gradient,
  swapped in for one ``signals`` call), the training metrics of every step equal those of
  the same run without probes.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from ablations.ablation_config import AblateConfig
from ablations.credit_probes import ProbeConfig
from ablations.driver import ablation_evals, compare_credits
from ablations.results import RunKey
from ablations.runner import run_train_config
from ablations.settings import SETTINGS
from backends.torch.trainer import GRPORecipe, resolve_config

pytestmark = pytest.mark.usefixtures("single_torch_thread")

TINY = {
    "num_train": 16,
    "num_held_out": 4,
    "num_pretrain": 32,
    "pretrain": {"steps": 2, "batch_size": 4},
}
PROBES = ProbeConfig(prompts=2, metric_samples=4, oracle_k=2)


def _history(
    tmp_path: Path, name: str, probes: bool, strategy: str = "datc_shuffled"
) -> list[dict[str, float]]:
    cfg = AblateConfig.model_validate(
        {
            "strategies": [
                "uniform",
                {"name": "datc_shuffled", "beta": 2.0},
                {"label": "mid", "name": "datc_mid"},
            ],
            "settings": {"positional_sparse": {"params": TINY}},
            "train": {
                "steps": 2,
                "rollout": {"group_size": 2, "prompts_per_step": 2},
                "eval": {"interval": 1, "greedy": False},
                "data": {"num_eval_prompts": 2},
            },
        }
    )
    kind = SETTINGS["positional_sparse"]
    assets = kind.build(kind.params.model_validate(TINY), "llama", tmp_path / "cache")
    run = RunKey("positional_sparse", "llama", strategy, 0)
    recipe = GRPORecipe(resolve_config(run_train_config(cfg, run, assets, tmp_path / name)))
    try:
        if probes:
            compare = compare_credits(recipe, [cfg.strategy("mid"), cfg.strategy("datc_shuffled")])
            return recipe.run(lambda: ablation_evals(recipe, assets, PROBES, compare)).history
        return recipe.run().history
    finally:
        recipe.close()


def test_probes_are_recorded_and_do_not_change_the_run(tmp_path: Path) -> None:
    probed = _history(tmp_path, "a", probes=True)
    plain = _history(tmp_path, "b", probes=False)
    assert [int(r["step"]) for r in probed] == [0, 1, 2]
    for record in probed:
        assert "eval/reward_sampled" in record
        assert -1.0 <= record["probe/grad_cos"] <= 1.0
        assert -1.0 <= record["probe/grad_split_half"] <= 1.0
        assert math.isfinite(record["probe/metric"])
    assert any(math.isfinite(r["probe/credit_corr"]) for r in probed)
    assert any(math.isfinite(r["probe/credit_corr@mid"]) for r in probed)
    assert any(math.isfinite(r["probe/oracle_credit_corr"]) for r in probed)
    for a, b in zip(probed, plain, strict=True):
        shared = {k for k in b if not k.startswith(("time/", "throughput/"))}
        assert {k: a[k] for k in shared} == {k: b[k] for k in shared}


def test_compared_credits_on_a_path_gradient_run(tmp_path: Path) -> None:
    """On a path-gradient run (``datc_mid``), a compared credit is its own: ``mid`` (the
    run's own credit) equals the run's correlation, and the plain ``datc_shuffled`` does not
    use the path."""
    (first, *_) = _history(tmp_path, "c", probes=True, strategy="mid")
    assert first["probe/credit_corr@mid"] == pytest.approx(first["probe/credit_corr"])
    assert first["probe/credit_corr@datc_shuffled"] != pytest.approx(first["probe/credit_corr"])
