"""Run by ``test_reward_pass.py`` on two gloo processes (``tests.helpers.gloo_ranks``), not
a test module: a reward model whose every forward and backward is a collective, as under
ZeRO-3 (``CountingGathers``), scored by processes whose rows differ. Each process writes
the number of gathers it entered and whether its results equal a local recomputation to
``<out>/rank<k>.json``. Imports neither TRL nor the trainer (two spawned processes must
start fast)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from adapters.reward_models import SeqClassificationRM
from backends.trl.reward_pass import fill_unmatched
from tests.helpers.gloo_ranks import init_group


class CountingGathers:
    """ZeRO-3's parameter all-gathers of ``model``, faked: one gloo all-reduce at each
    forward and each backward of the model (a collective every process must enter), counted."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.count = 0
        model.register_forward_pre_hook(lambda *_: self._gather())
        model.register_full_backward_pre_hook(lambda *_: self._gather())

    def _gather(self) -> None:
        dist.all_reduce(torch.ones(1))
        self.count += 1


def gloo_max(count: int) -> int:
    """``AgreeCount`` over the gloo group (what ``backends.trl.trainer.process_max`` does over
    TRL's processes)."""
    value = torch.tensor([count])
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return int(value)


def rollout(lengths: list[int], prompt: int, seed: int) -> dict[str, torch.Tensor]:
    """TRL's generation batch layout: left-padded prompts, right-padded completions."""
    g = torch.Generator().manual_seed(seed)
    B, T = len(lengths), max(lengths)
    completion_mask = (torch.arange(T) < torch.tensor(lengths).unsqueeze(1)).long()
    return {
        "prompt_ids": torch.randint(5, 500, (B, prompt), generator=g),
        "prompt_mask": torch.ones(B, prompt, dtype=torch.long),
        "completion_ids": torch.randint(5, 500, (B, T), generator=g) * completion_mask,
        "completion_mask": completion_mask,
    }


def main(rank: int, world: int, init_file: str, model_dir: str, out: str) -> None:
    torch.set_num_threads(1)
    init_group(rank, world, init_file)
    try:
        tok = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
        direction = SeqClassificationRM(model, tok, policy_vocab_size=len(tok), max_length=12)
        direction.prefix_batch_rows = 2
        gathers = CountingGathers(model)
        direction.agree_count = gloo_max
        record: dict[str, Any] = {}

        # one reward pass: rank 0 has two rows TRL's pass could not place, rank 1 none
        batch = rollout([4, 4, 4, 4], prompt=3, seed=rank)
        matched = (
            torch.tensor([True, False, False, True])
            if rank == 0
            else torch.ones(4, dtype=torch.bool)
        )
        grad = torch.zeros(4, 4, direction.reward_embedding.shape[1])
        before = gathers.count

        def score(rows: dict[str, torch.Tensor]) -> torch.Tensor:  # TRL's chunks of 2 rows
            parts = []
            for start in range(0, rows["completion_ids"].shape[0], 2):
                part = [rows[k][start : start + 2] for k in batch]
                out = direction.score(*part, with_grad=True).reward_grad
                assert out is not None
                parts.append(out)
            return torch.cat(parts)

        filled = fill_unmatched(grad, matched, batch, score, gloo_max)
        record["second_pass_gathers"] = gathers.count - before

        # prefix rewards: rank 0's first row reaches max_length (prefix_scores' passes, 4
        # chunks of 2), rank 1's rows are short (one chunk, or none: the reward forward)
        lengths = [5, 3] if rank == 0 else [1, 1]
        prefix_batch = rollout(lengths, prompt=7, seed=10 + rank)
        before = gathers.count
        prefix = direction.score(*prefix_batch.values(), with_grad=False, with_prefix_rewards=True)
        record["prefix_gathers"] = gathers.count - before
        record["gathers"] = gathers.count

        # the same results without collectives, on this process alone
        direction.agree_count = None
        model._forward_pre_hooks.clear()
        model._backward_pre_hooks.clear()
        expected = torch.zeros_like(grad)
        if filled:
            missing = (~matched).nonzero().squeeze(1)
            rows = [batch[k][missing] for k in batch]
            expected[missing] = direction.score(*rows, with_grad=True).reward_grad
        alone = direction.score(*prefix_batch.values(), with_grad=False, with_prefix_rewards=True)
        assert prefix.prefix_rewards is not None and alone.prefix_rewards is not None
        record["filled"] = filled
        record["grad_ok"] = bool(torch.allclose(grad, expected, atol=1e-6))
        record["prefix_ok"] = bool(
            torch.allclose(prefix.prefix_rewards, alone.prefix_rewards, atol=1e-5)
        )
        Path(out, f"rank{rank}.json").write_text(json.dumps(record))
    finally:
        dist.destroy_process_group()
