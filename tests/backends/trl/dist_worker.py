"""Run under ``torchrun --nproc_per_node 2`` by ``test_distributed.py``: on CPU (gloo), two
DATC steps of ``CreditGRPOTrainer`` with a direction model of its own, 6 rows per rank in
groups of 4 (a group straddles the ranks), each rank checking the token advantages that
reach TRL's loss (0 at padding, row means A) and logging the direction model's agreement
over the step's 3 groups; two ``entropy_top`` steps, each rank checking its
selection against TRL's own ``get_high_entropy_mask`` (quantile over both ranks); one
``random_top`` step saved to a checkpoint (each rank's stream in its own file). Each rank
writes what it saw to ``<out>/rank<k>.json``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from trl import GRPOTrainer

from backends.trl.cli import end_process
from backends.trl.tasks import PolicyPreset, task_data, tiny_policy
from tests.backends.trl.conftest import SignalDirection, make_trainer

#: The agreement's group counts (``AgreementMetrics.to_dict``), after its value.
GROUP_KEYS = ("agreement_groups", "agreement_skipped")


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
    trainer = make_trainer(
        task,
        tokenizer,
        out / "run",
        credit="datc",
        max_steps=2,
        per_device_train_batch_size=6,
        direction=SignalDirection(task.direction),
    )
    trainer.train()
    acc = trainer.accelerator
    record = {
        "world": acc.num_processes,
        "phase": trainer.credit_phase,
        "batches": seen,
        "metrics": [k for r in trainer.state.log_history for k in r if k.startswith("credit/")],
        "agreement": [
            [r.get(f"credit/{key}") for key in ("direction_agreement", *GROUP_KEYS)]
            for r in trainer.state.log_history
            if "credit/agreement_groups" in r
        ],
        "entropy_top_is_trl": entropy_top_matches_trl(task, tokenizer, out / "entropy", original),
        "random_top_state": random_top_state_saved(task, tokenizer, out / "random"),
    }
    (out / f"rank{acc.process_index}.json").write_text(json.dumps(record))


def entropy_top_matches_trl(task: Any, tokenizer: Any, out: Path, original: Any) -> list[bool]:
    """Per loss batch of two entropy_top steps: whether the token advantages equal A times
    TRL's ``get_high_entropy_mask`` (its own forward's entropies, quantile over both ranks)."""
    same: list[bool] = []

    def spy(self: Any, model: Any, inputs: dict[str, Any]) -> Any:
        A, mask = inputs["advantages"].clone(), inputs["completion_mask"]
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attn = torch.cat([inputs["prompt_mask"], mask], dim=1)
        with torch.no_grad():  # TRL's own forward, bypassing the trainer's hand-over
            _, entropies, _ = GRPOTrainer._get_per_token_logps_and_entropies(
                self, model, ids, attn, mask.shape[1], compute_entropy=True
            )
        selected = self.get_high_entropy_mask(entropies, mask, 0.8)
        loss = original(self, model, inputs)
        same.append(bool(torch.equal(inputs["advantages"], A.unsqueeze(1) * selected)))
        return loss

    GRPOTrainer._compute_loss = spy  # type: ignore[method-assign]
    try:
        make_trainer(task, tokenizer, out, credit="entropy_top", max_steps=2).train()
    finally:
        GRPOTrainer._compute_loss = original  # type: ignore[method-assign]
    return same


def random_top_state_saved(task: Any, tokenizer: Any, out: Path) -> bool:
    """Whether one random_top step saved this rank's own random stream with checkpoint-1."""
    settings = {"save_strategy": "steps", "save_steps": 1, "max_steps": 1}
    trainer = make_trainer(task, tokenizer, out, credit="random_top", **settings)
    trainer.train()
    rank = trainer.accelerator.process_index
    state = torch.load(out / "checkpoint-1" / f"credit_strategy_{rank}.pt", weights_only=True)
    return bool(torch.equal(state["generator"], trainer.strategy.generator.get_state()))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    end_process(0)  # as credit-trl leaves a multi-process run
