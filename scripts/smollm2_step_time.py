"""GGUF load time and the native trainer's step time per strategy on SmolLM2-135M-Instruct.

    OMP_NUM_THREADS=2 python scripts/smollm2_step_time.py [--rounds 2]
        [--strategies uniform datc ...] [--config configs/torch/smollm2_datc.yaml]
    OMP_NUM_THREADS=1 python scripts/smollm2_step_time.py --ablate configs/ablate/real_lm.yaml
        [--seed 0] [--rounds 2] [--strategies uniform datc ...]

Loads the config's GGUF policy three times in this process (``adapters.gguf.load_gguf``: the
first load dequantizes the file, the others copy the cached model) and prints the seconds
of each. Then builds one ``GRPORecipe`` per strategy (evaluation and credit samples off;
every other key the config's, so every strategy samples the same shape) and calls their
``train_step`` in alternation, the order reversed every round so that a slow phase of the
machine hits every strategy alike; the first round is a warm-up. Prints each step's phase
times (the trainer's own ``time/*`` metrics) and, per strategy, the medians over the timed
rounds and the median step's ratio to the first strategy's (GRPO's, by default).

With ``--config`` (a native trainer config) a strategy named as the config's ``credit``
keeps the config's parameters. With ``--ablate`` (an ablation config whose one setting
trains a GGUF policy, e.g. ``real_lm``) the strategies are the config's labels (default:
its baseline and the primary family's contenders) and each recipe is the runner's own run
of that label on ``--seed``'s assets (``runner.run_train_config``, the setting's frozen
lower stack applied): the shape, the direction model and the cost cut of the evidence runs.
The assets are built first where the cache lacks them (the real-LM outcome RM: minutes).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from adapters.gguf import load_gguf
from backends.torch.config import load_config
from backends.torch.trainer import GRPORecipe, resolve_config

PHASES = ("time/step", "time/rollout", "time/signals", "time/signals_reward", "time/update")
NO_EXTRAS = {
    "eval": {"interval": 0},
    "credit_samples": {"interval": 0},
    "logging": {"tensorboard": False, "progress": False},
}


def _time_loads(spec: Any) -> None:
    loads = []
    for _ in range(3):
        start = time.perf_counter()
        load_gguf(spec)
        loads.append(time.perf_counter() - start)
    print(f"load: first {loads[0]:.1f} s, cached {loads[1]:.2f} s, {loads[2]:.2f} s", flush=True)


def recipes_of_config(path: str, names: list[str], steps: int, out: Path) -> dict[str, GRPORecipe]:
    """One recipe per strategy name on the native config ``path``."""
    base = load_config(path)
    if base.policy.gguf is None:
        raise SystemExit(f"{path}: policy.gguf is not set")
    _time_loads(base.policy.gguf)
    recipes = {}
    for name in names:
        overrides = [] if name == base.credit.name else [f"credit={name}"]  # the config's own
        overrides += [
            f"output_dir={out / name}",
            f"steps={steps}",
            "eval.interval=0",
            "credit_samples.interval=0",
            "logging.tensorboard=false",
            "logging.progress=false",
        ]
        recipes[name] = GRPORecipe(load_config(path, overrides))
    return recipes


def recipes_of_ablation(
    path: str, labels: list[str] | None, seed: int, steps: int, out: Path
) -> dict[str, GRPORecipe]:
    """One recipe per strategy label of the ablation config ``path``: the runner's run of
    that label on its one setting, first family and model seed ``seed``."""
    from ablations.ablation_config import deep_merge, load_ablate_config
    from ablations.results import RunKey
    from ablations.runner import build_assets, run_train_config

    cfg = load_ablate_config(path)
    if len(cfg.settings) != 1:
        raise SystemExit(f"{path}: expected one setting, got {list(cfg.settings)}")
    setting, family = next(iter(cfg.settings)), cfg.families[0]
    family_cfg = cfg.report.primary_family
    chosen = labels or [cfg.baseline, *(family_cfg.against_baseline if family_cfg else [])]
    assets = build_assets(cfg, (setting, family, seed if cfg.model_seeds else None), print)
    recipes = {}
    for label in chosen:
        run = RunKey(setting, family, label, seed)
        merged = deep_merge(run_train_config(cfg, run, assets, out / label), NO_EXTRAS)
        recipe = GRPORecipe(resolve_config({**merged, "steps": steps}))
        if assets.prepare_policy is not None:
            assets.prepare_policy(recipe.policy.model)
        recipes[label] = recipe
    gguf = getattr(cfg.setting_params(setting, seed), "gguf", None)
    if gguf is not None:
        _time_loads(gguf)
    return recipes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/torch/smollm2_datc.yaml")
    parser.add_argument("--ablate", help="an ablation config of one GGUF setting (real_lm)")
    parser.add_argument("--seed", type=int, default=0, help="with --ablate: the model seed")
    parser.add_argument(
        "--strategies",
        nargs="+",
        help="default: uniform datc (--config), "
        "the baseline and the primary family's contenders (--ablate)",
    )
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds after the warm-up")
    args = parser.parse_args()

    out = Path(tempfile.mkdtemp(prefix="smollm2_step_time-"))
    steps = args.rounds + 1
    if args.ablate:
        recipes = recipes_of_ablation(args.ablate, args.strategies, args.seed, steps, out)
    else:
        recipes = recipes_of_config(args.config, args.strategies or ["uniform", "datc"], steps, out)
    timed: dict[str, list[dict[str, float]]] = {name: [] for name in recipes}
    try:
        for r in range(steps):
            order = list(recipes) if r % 2 == 0 else list(reversed(recipes))
            for name in order:
                metrics = recipes[name].train_step()
                phases = {k: round(metrics.get(k, 0.0), 2) for k in PHASES}
                print(f"round {r}{' (warm-up)' if r == 0 else ''} {name}: {phases}", flush=True)
                if r > 0:
                    timed[name].append(metrics)
    finally:
        for recipe in recipes.values():
            recipe.close()
    first = None
    for name, done in timed.items():
        medians = {k: round(statistics.median(m.get(k, 0.0) for m in done), 2) for k in PHASES}
        first = first or medians["time/step"]
        ratio = medians["time/step"] / first
        print(f"median over {len(done)} steps, {name}: {medians}; step x{ratio:.2f} of the first")


if __name__ == "__main__":
    main()
