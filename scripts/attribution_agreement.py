"""Does the direction model's *gradient* explain the reward, where its *score* does?

    OMP_NUM_THREADS=1 python scripts/attribution_agreement.py configs/ablate/gate.yaml \
        --settings outcome_chain sweep_96 proxy_05 [--steps 4] [--out attribution.csv]

The agreement the gate reads (``credit/direction_agreement``) ranks the direction model's
SCORES against the reward within each group. A token-credit strategy reads its GRADIENT, so
the score can order a group's responses right while the gradient, taken token by token, does
not explain why. This measures, on the step-0 policy of each (setting, family, model seed)
of an ablation config (its cached assets; ``--steps`` rollouts of the trainer's own batch
shape, no update), both:

- ``score``: the within-group Spearman agreement of the direction model's scores with the
  reward (``direction_agreement``, what every backend logs);
- ``attribution``: the same agreement of each response's summed first-order attribution,
  sum_t (e_t - e_null) . g_t (P2T's ``reward_attribution``, from the reward gradient g that
  DATC also reads): how far the gradient's linear account of each response orders the group
  as the reward does.

Both are means over the steps of the step's mean over its groups with varying reward. Each
row goes to ``--out`` (CSV: setting, family, seed, score, attribution, groups).
"""

from __future__ import annotations

import argparse
import csv
import math
import tempfile
from pathlib import Path

import torch

from ablations.ablation_config import deep_merge, load_ablate_config
from ablations.results import RunKey
from ablations.runner import build_assets, run_train_config
from backends.torch.trainer import GRPORecipe, resolve_config

QUIET = {
    "eval": {"interval": 0},
    "credit_samples": {"interval": 0},
    "logging": {"tensorboard": False, "progress": False},
}
#: The strategy whose signals are read: P2T's mean form needs the reward gradient and the
#: attribution; its own credit is not used.
LOOK = "p2t_matched"


def measure(recipe: GRPORecipe, steps: int) -> tuple[float, float, int]:
    """(score agreement, attribution agreement, groups used) over ``steps`` rollouts of the
    step-0 policy: each the trainer's own ``AgreementMetrics`` of a look at the batch (P2T
    reads the attribution, so its step measures both), no update."""
    scores, attributions, used = [], [], 0
    for _ in range(steps):
        recipe.step += 1
        got = recipe.signals(recipe.next_rollout(), recipe.train_prompts).agreement
        assert got is not None and got.attribution is not None  # P2T reads the attribution
        if got.groups:
            scores.append(got.value)
            attributions.append(got.attribution)
            used += got.groups
    return _mean(scores), _mean(attributions), used


def _mean(values: list[float]) -> float:
    return math.fsum(values) / len(values) if values else math.nan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("config")
    parser.add_argument("--settings", nargs="+", required=True)
    parser.add_argument("--families", nargs="+")
    parser.add_argument("--seeds", nargs="+", type=int)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", default="attribution_agreement.csv")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = load_ablate_config(args.config)
    out = Path(tempfile.mkdtemp(prefix="attribution_agreement-"))
    rows = []
    for setting in args.settings:
        for family in args.families or cfg.families:
            for seed in args.seeds or cfg.seeds:
                key = (setting, family, seed if cfg.model_seeds else None)
                assets = build_assets(cfg, key, print)
                run = RunKey(setting, family, LOOK, seed)
                folder = out / run.relpath
                merged = deep_merge(run_train_config(cfg, run, assets, folder), QUIET)
                recipe = GRPORecipe(resolve_config(merged))
                try:
                    score, attribution, used = measure(recipe, args.steps)
                finally:
                    recipe.close()
                row = {
                    "setting": setting,
                    "family": family,
                    "seed": seed,
                    "score": round(score, 4),
                    "attribution": round(attribution, 4),
                    "groups": used,
                }
                print(row, flush=True)
                rows.append(row)
    with open(args.out, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
