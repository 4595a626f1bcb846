"""Where a credit strategy's extra signals time goes, for one run config of an ablation.

    OMP_NUM_THREADS=1 python scripts/signal_split.py \\
        runs/ablate/quick/runs/minilm_shared/llama/datc/seed0/train/config.yaml

Builds the run's ``GRPORecipe`` (a fresh output folder), samples one rollout, then times
(median of 7 after one warm-up) each piece of ``GRPORecipe.signals`` with and without what
DATC adds: the rewards with and without the direction model's input gradient, and the old
policy's pass alone, with W0 streamed from the reward gradient, and with ``PolicyStats``.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import torch

from backends.torch.trainer import GRPORecipe, resolve_config


def median_seconds(fn: Callable[[], object], repeats: int = 7) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(config: str) -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        overrides = [f"output_dir={tmp}/run", "logging.progress=false", "logging.tensorboard=false"]
        r = GRPORecipe(resolve_config(config, overrides))
        cfg = r.cfg
        batch = r.next_rollout()
        size = cfg.algorithm.micro_batch_size
        grad = r.reward.compute(batch, with_grad=True, micro_batch_size=size).reward_grad
        pieces: dict[str, Callable[[], object]] = {
            "rewards": lambda: r.reward.compute(batch, with_grad=False, micro_batch_size=size),
            "rewards + input gradient": lambda: r.reward.compute(
                batch, with_grad=True, micro_batch_size=size
            ),
            "old-policy log-probs": lambda: r.credit.old_policy_pass(r.model, batch),
            "old-policy log-probs + W0": lambda: r.credit.old_policy_pass(
                r.model, batch, embedding=r.reward.embedding, reward_grad=grad
            ),
            "old-policy log-probs + PolicyStats": lambda: r.credit.old_policy_pass(
                r.model, batch, embedding=r.reward.embedding, stats=True
            ),
            "whole signals()": lambda: r.signals(batch, r.train_prompts),
        }
        emb = r.reward.embedding
        shape = "" if emb is None else f" V={emb.shape[0]} d={emb.shape[1]}"
        print(f"{config}: B={batch.size} R={batch.response_len}{shape}")
        for name, fn in pieces.items():
            print(f"  {name}: {median_seconds(fn) * 1e3:.0f} ms")
        r.logger.close()
        r.close()


if __name__ == "__main__":
    main(sys.argv[1])
