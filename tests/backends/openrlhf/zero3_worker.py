"""Run by ``test_one_pass.py`` on two gloo processes (``tests.helpers.gloo_ranks``), not a
test module: OpenRLHF's ``RewardModel`` under REAL DeepSpeed ZeRO-3 on the CPU (DeepSpeed's
CPU accelerator, gloo), built as OpenRLHF's reward-model actor builds it
(``get_llm_for_sequence_regression`` with OpenRLHF's stage-3 eval config: shape-[0]
partitions from ``deepspeed.zero.Init``, then ``deepspeed.initialize``), with the one-pass
forward bound on it. Each process scores micro-batches of its own and writes what it saw to
``<out>/rank<k>.json``; a process entering a collective the other does not reach fails on
the group's timeout."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from tests.helpers.gloo_ranks import init_group
from tests.helpers.openrlhf_stubs import install_openrlhf_stubs
from tests.helpers.zero3 import init_deepspeed_on_gloo

MEAN, STD = 0.3, 2.5


class Tokenizer:
    """The policy tokenizer as the one-pass embedding export reads it (its length)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size


def load(folder: str, ds_config: dict[str, Any] | None) -> Any:
    """OpenRLHF's ``RewardModel`` (bf16, normalization on) as its reward actor loads it;
    partitioned by ``deepspeed.zero.Init`` when ``ds_config`` is stage 3."""
    from openrlhf.models import get_llm_for_sequence_regression

    model = get_llm_for_sequence_regression(
        folder, "reward", normalize_reward=True, attn_implementation="eager", ds_config=ds_config
    )
    model.mean[0], model.std[0] = MEAN, STD  # as test_one_pass.openrlhf_reward_model
    return model


def main(rank: int, world: int, init_file: str, folder: str, vocab: int, out: str) -> None:
    torch.set_num_threads(1)
    install_openrlhf_stubs()
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    init_group(rank, world, init_file)
    import deepspeed
    from openrlhf.utils.deepspeed.deepspeed_utils import get_eval_ds_config

    from adapters.partitioned import is_partitioned
    from backends.openrlhf.actor_side import (
        ActorCreditState,
        bind_credit_methods,
        export_reward_embedding,
        reward_and_input_grad,
    )
    from tests.backends.openrlhf.policy_host import RewardHost
    from tests.backends.openrlhf.test_baselines import micro_batches

    init_deepspeed_on_gloo()
    config = get_eval_ds_config(offload=False, stage=3, param_dtype="bf16")
    config.update(train_micro_batch_size_per_gpu=1, train_batch_size=world)
    whole = load(folder, None).eval()
    engine, *_ = deepspeed.initialize(model=load(folder, config), config=config)
    engine.eval()
    params = list(engine.module.parameters())
    record: dict[str, Any] = {"partitioned": all(is_partitioned(p) for p in params)}

    first, second, third = micro_batches()  # 3, 3 and 2 rows: the ranks' rows differ
    mine = [first, third] if rank == 0 else [second, third]
    host = RewardHost(engine)
    stock = host.run(mine)  # RewardModelActor.forward: the engine under no_grad
    state = ActorCreditState(frozenset({"reward_grad"}), None, Tokenizer(vocab), 16, one_pass=True)
    bind_credit_methods(host, "reward", state)
    host.forwards = 0
    rewards = host.run(mine)
    record["passes"] = [host.forwards, host.backwards]
    record["rewards_bitwise"] = all(
        torch.equal(got, want) and got.dtype == want.dtype
        for got, want in zip(rewards, stock, strict=True)
    )
    grads_ok = True
    for batch, reward in zip(mine, rewards, strict=True):
        signals = host.credit_reward_signals(  # type: ignore[attr-defined]
            sequences=batch.sequences,
            action_mask=batch.action_mask,
            attention_mask=batch.attention_mask,
        )
        want_reward, want_grad = reward_and_input_grad(whole, batch.sequences, batch.attention_mask)
        A = batch.action_mask.shape[1]
        on = batch.action_mask.bool().unsqueeze(2)
        want = torch.where(on, want_grad[:, -A:].float(), 0.0)
        grads_ok &= torch.equal(want_reward, reward)
        grads_ok &= bool(want.abs().sum() > 0) and torch.equal(signals.reward_grad, want)
    record["grad_equals_unpartitioned"] = grads_ok
    record["passes_after_signals"] = [host.forwards, host.backwards]

    # a micro-batch whose one-pass forward rank 0 did not see: rank 1 saw its own, and
    # still enters the pass rank 0 needs now (its result dropped)
    late = first if rank == 0 else second
    host.run([third if rank == 0 else late])  # one one-pass forward each
    before = [host.forwards, host.backwards]
    host.credit_reward_signals(  # type: ignore[attr-defined]
        sequences=late.sequences,
        action_mask=late.action_mask,
        attention_mask=late.attention_mask,
    )
    record["late_passes"] = [host.forwards - before[0], host.backwards - before[1]]

    record["released_after_passes"] = all(is_partitioned(p) for p in params)
    table = export_reward_embedding(host, keep=rank == 0)
    want_table = whole.get_input_embeddings().weight.detach()[:vocab].float()
    record["table"] = None if table is None else bool(torch.equal(table, want_table))
    record["released_after_export"] = all(is_partitioned(p) for p in params)
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))
