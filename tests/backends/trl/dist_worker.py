"""Run under ``torchrun --nproc_per_node 2`` by ``test_distributed.py``: two DATC steps of
``CreditGRPOTrainer`` on CPU (gloo); each rank checks the token advantages that reach TRL's
loss (0 at padding, row means A) and writes what it saw to ``<out>/rank<k>.json``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from trl import GRPOTrainer

from backends.trl.tasks import PolicyPreset, task_data, tiny_policy
from tests.backends.trl.conftest import make_trainer


def main(out: Path) -> None:
    torch.set_num_threads(1)
    tokenizer = tiny_policy(PolicyPreset())[1]
    task = task_data(
        "positional", {"positions": [2, 9, 17]}, len(tokenizer), tokenizer, torch.device("cpu")
    )
    seen: list[dict[str, Any]] = []
    original = GRPOTrainer._compute_loss

    def spy(self: Any, model: Any, inputs: dict[str, Any]) -> Any:
        A = inputs["advantages"].clone()
        loss = original(self, model, inputs)
        adv, mask = inputs["advantages"], inputs["completion_mask"].bool()
        seen.append(
            {
                "rows": int(mask.shape[0]),
                "zero_at_padding": bool((adv[~mask] == 0).all()),
                "row_mean_err": float((adv.sum(1) / mask.sum(1) - A).abs().max()),
                "uneven": bool((adv != A.unsqueeze(1) * mask).any()),
            }
        )
        return loss

    GRPOTrainer._compute_loss = spy  # type: ignore[method-assign]
    trainer = make_trainer(task, tokenizer, out / "run", credit="datc", max_steps=2)
    trainer.train()
    acc = trainer.accelerator
    record = {
        "world": acc.num_processes,
        "phase": trainer.credit_phase,
        "batches": seen,
        "metrics": [k for r in trainer.state.log_history for k in r if k.startswith("credit/")],
    }
    (out / f"rank{acc.process_index}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
