"""Run by ``test_reward_pass.py`` on gloo processes (``tests.helpers.gloo_ranks``), not a test
module: TRL's reward model in a REAL DeepSpeed engine on the CPU (DeepSpeed's CPU
accelerator, gloo), prepared as ``GRPOTrainer`` prepares it (``trl.models.utils
.prepare_deepspeed``: ``deepspeed.initialize`` without an optimizer, ZeRO-3 kept, any other
stage turned into 0), and scored by TRL's own ``GRPOTrainer._calculate_rewards`` once with
the engine (stock TRL) and once with the ``GradientRewardModel`` the credit trainer puts in
its place; one engine after the other, for each case ``main`` is given. Under ZeRO-3 the
model is loaded as TRL loads it while the trainer's live DeepSpeed config is set
(``from_pretrained`` inside ``deepspeed.zero.Init``: shape-[0] partitions). Each process
writes what it saw of a case to ``<out>/<case>-rank<k>.json``; a process entering a
collective the other does not reach fails on the group's timeout."""

from __future__ import annotations

import json
import os
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist

from tests.helpers.gloo_ranks import init_group
from tests.helpers.zero3 import init_deepspeed_on_gloo

#: Prompt and completion texts per process (whole words: a completion's ids re-tokenize
#: to themselves after its prompt); the processes' rows differ in number and length.
TEXTS = {
    0: [
        ("The cat", " sat on the mat"),
        ("A quick", " brown fox jumps over the lazy dog"),
        ("Good answers", " are short"),
    ],
    1: [("She is", " playing the piano"), ("We trained", " a small policy")],
}


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want|."""
    return float((got - want).abs().max() / want.abs().max())


def ds_config(stage: int, dtype: str, autocast: bool) -> dict[str, Any]:
    """A DeepSpeed config as accelerate hands it to TRL (batch sizes resolved, gradient
    accumulation 4, an optimizer block ``prepare_deepspeed`` drops), every ZeRO-3 weight
    partitioned (persistence threshold 0)."""
    config: dict[str, Any] = {
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 4,
        "train_batch_size": 8 * dist.get_world_size(),
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-5}},
        "bf16": {"enabled": dtype == "bf16"},
    }
    if autocast:
        config["torch_autocast"] = {"enabled": True, "dtype": "bfloat16"}
    return config


def calculate_rewards(reward_model: torch.nn.Module, tokenizer: Any, rank: int) -> torch.Tensor:
    """TRL's ``GRPOTrainer._calculate_rewards`` of this process's ``TEXTS`` with
    ``reward_model`` as the one reward function, on a trainer holding only what that method
    reads; TRL's gather of the rewards over processes is left out (each process compares its
    own rows)."""
    import trl.trainer.grpo_trainer as grpo

    trainer = grpo.GRPOTrainer.__new__(grpo.GRPOTrainer)
    trainer.__dict__.update(
        reward_funcs=[reward_model],
        reward_processing_classes=[tokenizer],
        reward_func_names=["rm"],
        accelerator=SimpleNamespace(device=torch.device("cpu"), is_main_process=rank == 0),
        args=SimpleNamespace(device=torch.device("cpu"), report_to=[]),
        state=SimpleNamespace(global_step=0),
        is_deepspeed_enabled=False,  # the inputs are token ids: no dtype cast either way
        environments=None,
        chat_template_kwargs={},
        _log_completion_extra=lambda *a, **k: None,
        _log_metric=lambda *a, **k: None,
    )
    prompts, completions = zip(*TEXTS[rank], strict=True)
    inputs = [{"prompt": p} for p in prompts]
    gather = getattr(grpo, "gather")  # noqa: B009
    setattr(grpo, "gather", lambda t: t)  # noqa: B010
    try:
        return trainer._calculate_rewards(inputs, list(prompts), list(completions), None)[:, 0]  # type: ignore[no-any-return]
    finally:
        setattr(grpo, "gather", gather)  # noqa: B010


class Passes:
    """Forwards of ``model`` and backward passes through its score head, counted."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.forwards = self.backwards = 0
        model.register_forward_pre_hook(lambda *_: self._add("forwards"))
        model.score.register_full_backward_pre_hook(lambda *_: self._add("backwards"))  # type: ignore[union-attr]

    def _add(self, name: str) -> None:
        setattr(self, name, getattr(self, name) + 1)

    def now(self) -> list[int]:
        return [self.forwards, self.backwards]


def gloo_gather(value: torch.Tensor) -> torch.Tensor:
    """``accelerator.gather`` over the gloo group (what ``process_max`` calls)."""
    parts = [torch.zeros_like(value) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, value)
    return torch.cat(parts)


def completion_batch(tokenizer: Any, rank: int) -> dict[str, torch.Tensor]:
    """TRL's generation batch of this process's ``TEXTS`` (left-padded prompts,
    right-padded completions); on process 0 the last row's completion ids are not those of
    its text (as after a chat template): TRL's pass cannot place it."""
    prompts = tokenizer(
        [p for p, _ in TEXTS[rank]], padding=True, padding_side="left", return_tensors="pt"
    )
    completions = tokenizer(
        [c for _, c in TEXTS[rank]],
        padding=True,
        padding_side="right",
        add_special_tokens=False,
        return_tensors="pt",
    )
    completion_ids = completions["input_ids"].clone()
    if rank == 0:
        completion_ids[-1] = (completion_ids[-1] + 1) * completions["attention_mask"][-1]
    return {
        "prompt_ids": prompts["input_ids"],
        "prompt_mask": prompts["attention_mask"],
        "completion_ids": completion_ids,
        "completion_mask": completions["attention_mask"],
    }


#: One engine to check: (name, checkpoint folder, ZeRO stage, dtype "fp32"/"bf16", the
#: engine's ``torch_autocast`` on); the process writes ``<out>/<name>-rank<k>.json``.
Case = tuple[str, str, int, str, bool]


def main(rank: int, world: int, init_file: str, cases: list[Case], out: str) -> None:
    from tests.helpers.openrlhf_stubs import stubs_hidden

    # a spawned process inherits the test process's sys.path, which OpenRLHF's tests extend
    # with their stubs (a ``vllm`` that TRL's import would take for the real one)
    with stubs_hidden():
        torch.set_num_threads(1)
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
        init_group(rank, world, init_file, collective_timeout=60)
        init_deepspeed_on_gloo()
        for name, folder, stage, dtype, autocast in cases:  # one engine after the other
            record = _check(rank, world, folder, stage, dtype, autocast)
            Path(out, f"{name}-rank{rank}.json").write_text(json.dumps(record))
        dist.destroy_process_group()


def _check(
    rank: int, world: int, folder: str, stage: int, dtype: str, autocast: bool
) -> dict[str, Any]:
    """What this process saw of TRL's reward model in one engine (the module docstring)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from transformers.integrations.deepspeed import HfDeepSpeedConfig
    from trl.models.utils import prepare_deepspeed

    from adapters.input_grad import forward_with_input_grad
    from adapters.partitioned import is_partitioned
    from adapters.reward_models import SeqClassificationRM
    from backends.trl.reward_pass import GradientRewardModel, completion_reward_grad, fill_unmatched
    from backends.trl.trainer import CreditGRPOTrainer

    config = ds_config(stage, dtype, autocast)
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    tok = AutoTokenizer.from_pretrained(folder)
    whole = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch_dtype).eval()
    # what TrainingArguments holds under ZeRO-3
    live = HfDeepSpeedConfig(config) if stage == 3 else None  # type: ignore[no-untyped-call]
    model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch_dtype)
    del live
    accelerator = SimpleNamespace(
        state=SimpleNamespace(deepspeed_plugin=SimpleNamespace(deepspeed_config=config))
    )
    engine = prepare_deepspeed(model, accelerator)  # as GRPOTrainer.__init__ does
    params = list(engine.module.parameters())
    record: dict[str, Any] = {"partitioned": all(is_partitioned(p) for p in params)}

    stock = calculate_rewards(engine, tok, rank)
    passes = Passes(engine.module)
    shared = GradientRewardModel(engine)
    rewards = calculate_rewards(shared, tok, rank)
    record["rewards_bitwise"] = bool(torch.equal(rewards, stock))
    record["passes"] = passes.now()
    record["released_after_pass"] = all(is_partitioned(p) for p in params) == (stage == 3)
    scored = shared.take()

    # dR/dx of the same input through the unpartitioned module, outside any engine
    context = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else nullcontext()
    with torch.enable_grad():
        want_out, want = forward_with_input_grad(
            whole,
            lambda m: _under(
                context,
                lambda: m(input_ids=scored.input_ids, attention_mask=scored.attention_mask),
            ),
            lambda o: o.logits[:, 0],
        )
    on = scored.attention_mask.bool().unsqueeze(2)
    want = torch.where(on, want.float(), 0.0)
    record["grad_nonzero"] = bool(want.abs().sum() > 0)
    record["grad_equals_unpartitioned"] = bool(torch.equal(scored.grad, want))
    record["grad_error"] = relative_error(scored.grad, want)
    record["rewards_equal_unpartitioned"] = bool(torch.equal(want_out.logits[:, 0].float(), stock))

    if world > 1:  # the rows TRL's pass cannot place: the direction model's own pass
        batch = completion_batch(tok, rank)
        special = torch.tensor(tok.all_special_ids, dtype=torch.long)
        grad, matched = completion_reward_grad(
            scored, batch["completion_ids"], batch["completion_mask"], special
        )
        record["matched"] = matched.tolist()
        direction = SeqClassificationRM(engine.module, tok, tok, policy_vocab_size=len(tok))
        trainer: Any = SimpleNamespace(
            accelerator=SimpleNamespace(num_processes=world, device="cpu", gather=gloo_gather)
        )
        agree = CreditGRPOTrainer.collective_agreement(trainer, direction)
        record["agrees"] = agree is not None and direction.agree_count is agree
        before = passes.now()

        def score(rows: dict[str, torch.Tensor]) -> torch.Tensor:
            out = direction.score(*rows.values(), with_grad=True).reward_grad
            assert out is not None
            return out

        record["filled"] = fill_unmatched(grad, matched, batch, score, agree)
        record["fill_passes"] = [a - b for a, b in zip(passes.now(), before, strict=True)]
        record["released_after_fill"] = all(is_partitioned(p) for p in params)
        alone = SeqClassificationRM(whole, tok, tok, policy_vocab_size=len(tok))
        missing = (~matched).nonzero().squeeze(1)
        expected = grad.clone()
        if missing.numel():
            rows = [batch[k][missing] for k in batch]
            alone_grad = alone.score(*rows, with_grad=True).reward_grad
            assert alone_grad is not None
            expected[missing] = alone_grad
        record["fill_error"] = relative_error(grad, expected)
    return record


def _under(context: Any, call: Any) -> Any:
    with context:
        return call()
