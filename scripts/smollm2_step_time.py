"""GGUF load time and the native trainer's step time per strategy on SmolLM2-135M-Instruct.

    OMP_NUM_THREADS=2 python scripts/smollm2_step_time.py [--rounds 2]
        [--strategies uniform datc ...] [--config configs/torch/smollm2_datc.yaml]

Loads the config's GGUF policy three times in this process (``adapters.gguf.load_gguf``: the
first load dequantizes the file, the others copy the cached model) and prints the seconds
of each. Then builds one ``GRPORecipe`` per strategy on the config (evaluation and credit
samples off; every other key the config's, so every strategy samples the same shape) and
calls their ``train_step`` in alternation (a strategy named as the config's ``credit`` keeps
the config's parameters), the order reversed every round so that a slow
phase of the machine hits every strategy alike; the first round is a warm-up. Prints each
step's phase times (the trainer's own ``time/*`` metrics) and, per strategy, the medians
over the timed rounds.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from adapters.gguf import load_gguf
from backends.torch.config import load_config
from backends.torch.trainer import GRPORecipe

PHASES = ("time/step", "time/rollout", "time/signals", "time/signals_reward", "time/update")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/torch/smollm2_datc.yaml")
    parser.add_argument("--strategies", nargs="+", default=["uniform", "datc"])
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds after the warm-up")
    args = parser.parse_args()

    base = load_config(args.config)
    assert base.policy.gguf is not None, f"{args.config}: policy.gguf is not set"
    loads = []
    for _ in range(3):
        start = time.perf_counter()
        load_gguf(base.policy.gguf)
        loads.append(time.perf_counter() - start)
    print(f"load: first {loads[0]:.1f} s, cached {loads[1]:.2f} s, {loads[2]:.2f} s", flush=True)

    out = Path(tempfile.mkdtemp(prefix="smollm2_step_time-"))
    recipes = {}
    for name in args.strategies:
        overrides = [] if name == base.credit.name else [f"credit={name}"]  # the config's own
        overrides += [
            f"output_dir={out / name}",
            f"steps={args.rounds + 1}",
            "eval.interval=0",
            "credit_samples.interval=0",
            "logging.tensorboard=false",
            "logging.progress=false",
        ]
        recipes[name] = GRPORecipe(load_config(args.config, overrides))
    timed: dict[str, list[dict[str, float]]] = {name: [] for name in recipes}
    try:
        for r in range(args.rounds + 1):
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
    for name, steps in timed.items():
        medians = {k: round(statistics.median(m.get(k, 0.0) for m in steps), 2) for k in PHASES}
        print(f"median over {len(steps)} steps, {name}: {medians}")


if __name__ == "__main__":
    main()
