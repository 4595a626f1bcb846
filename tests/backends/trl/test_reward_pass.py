"""One reward-model pass for TRL's reward and DATC's gradient (``backends.trl.reward_pass``):
TRL's reward unchanged, its reward model run once per generation batch, the gradient that of
TRL's own input moved to the completion tokens, the direction model's own pass only for the
rows that cannot be placed; under ZeRO-3 (every reward-model forward a collective) the same
number of passes on every process."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from trl import GRPOTrainer

from adapters.reward_models import SeqClassificationRM
from adapters.tiny import tiny_seq_classifier
from backends.trl import CreditGRPOConfig, CreditGRPOTrainer
from backends.trl.reward_pass import GradientRewardModel, RewardPass, completion_reward_grad
from backends.trl.tasks import PolicyPreset, TaskData, tiny_policy
from tests.backends.trl import engine_worker, zero3_worker
from tests.backends.trl.conftest import BASE
from tests.helpers.gloo_ranks import run_ranks
from tests.helpers.zero3 import FakeZero3

SETTINGS: dict[str, Any] = {
    "num_generations": 4,
    "per_device_train_batch_size": 8,
    "max_completion_length": 12,
    "max_steps": 1,
    "seed": 0,
    **BASE,
}


def whole_word_tokens(tokenizer: Any) -> list[int]:
    """Tokens that decode to a space and letters and encode back to themselves: any run of
    them after a prompt re-tokenizes to the same ids (the pre-tokenizer splits at spaces)."""
    found = []
    for i in range(len(tokenizer)):
        text = tokenizer.decode([i])
        if i in tokenizer.all_special_ids or not text.startswith(" ") or not text[1:].isalpha():
            continue
        if tokenizer(text, add_special_tokens=False)["input_ids"] == [i]:
            found.append(i)
    return found


def _trainer(
    task: TaskData,
    tokenizer: Any,
    tmp_path: Any,
    rm: torch.nn.Module,
    credit: str | None,
    *,
    whole_words: bool = True,
) -> Any:
    """Stock TRL (``credit`` None) or the credit trainer; with ``whole_words`` the policy
    samples only ``whole_word_tokens`` and EOS (a random policy's arbitrary token runs do
    not re-tokenize to themselves: those rows would take the direction model's pass)."""
    settings = dict(SETTINGS)
    if whole_words:
        keep = {*whole_word_tokens(tokenizer), tokenizer.eos_token_id}
        others = [i for i in range(len(tokenizer)) if i not in keep]
        settings["generation_kwargs"] = {"suppress_tokens": others}
    common = {
        "model": tiny_policy(PolicyPreset())[0],
        "reward_funcs": rm,
        "train_dataset": task.train,
        "processing_class": tokenizer,
        "reward_processing_classes": tokenizer,
    }
    if credit is None:
        from trl import GRPOConfig

        return GRPOTrainer(args=GRPOConfig(output_dir=str(tmp_path), **settings), **common)
    args = CreditGRPOConfig(output_dir=str(tmp_path), credit=credit, **settings)
    return CreditGRPOTrainer(args=args, **common)


def reward_model(tokenizer: Any) -> torch.nn.Module:
    """TRL's reward model here: a tiny Llama sequence classifier on the policy's tokenizer."""
    return tiny_seq_classifier("llama", len(tokenizer), pad_token_id=tokenizer.pad_token_id)


@pytest.fixture
def rm(tokenizer: Any) -> torch.nn.Module:
    return reward_model(tokenizer)


def save_checkpoint(model: torch.nn.Module, tokenizer: Any, folder: Path) -> str:
    model.save_pretrained(folder)  # type: ignore[operator]
    tokenizer.save_pretrained(folder)
    return str(folder)


#: TRL's reward model in a DeepSpeed engine below ZeRO-3 (stage 0), by test id: the
#: checkpoint's dtype, and whether the engine's config turns on ``torch_autocast``.
STAGE0 = {"fp32": ("fp32", False), "bf16": ("bf16", False), "torch_autocast": ("fp32", True)}


@pytest.fixture(scope="module")
def stage0_records(
    tmp_path_factory: pytest.TempPathFactory, tokenizer: Any
) -> dict[str, dict[str, Any]]:
    """What one process saw of each ``STAGE0`` engine, built one after the other (the
    engines share nothing but the process and its gloo group)."""
    out = tmp_path_factory.mktemp("stage0")
    rm = reward_model(tokenizer)
    folders = {
        "fp32": save_checkpoint(rm, tokenizer, out / "rm_fp32"),
        "bf16": save_checkpoint(copy.deepcopy(rm).to(torch.bfloat16), tokenizer, out / "rm_bf16"),
    }
    cases = [
        (name, folders[dtype], 2, dtype, autocast) for name, (dtype, autocast) in STAGE0.items()
    ]
    run_ranks(engine_worker.main, out, (cases, str(out)), world=1, timeout=300)
    return {name: json.loads((out / f"{name}-rank0.json").read_text()) for name in STAGE0}


class Calls:
    """Forwards of ``model`` and the rewards TRL computed (``_calculate_rewards``)."""

    def __init__(self, model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch) -> None:
        self.forwards = 0
        self.rewards: list[torch.Tensor] = []
        model.register_forward_pre_hook(self._count)
        real = GRPOTrainer._calculate_rewards

        def spy(trainer: Any, *args: Any) -> torch.Tensor:
            out: torch.Tensor = real(trainer, *args)
            self.rewards.append(out.clone())
            return out

        monkeypatch.setattr(GRPOTrainer, "_calculate_rewards", spy)

    def _count(self, module: Any, args: Any) -> None:
        self.forwards += 1


def test_one_pass_gives_trls_reward_from_its_one_reward_model_forward(
    task: TaskData,
    tokenizer: Any,
    tmp_path: Any,
    rm: torch.nn.Module,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Same policy, seed and reward model: the credit trainer's rewards equal stock TRL's
    bit for bit, from as many reward-model forwards (one per generation batch), and the
    direction model never runs its own pass when every row is placed."""
    stock_rm, ours_rm = copy.deepcopy(rm), copy.deepcopy(rm)
    stock_calls = Calls(stock_rm, monkeypatch)
    _trainer(task, tokenizer, tmp_path / "s", stock_rm, None).train()
    monkeypatch.undo()
    ours_calls = Calls(ours_rm, monkeypatch)
    scored: list[int] = []
    real_score = SeqClassificationRM.score
    monkeypatch.setattr(
        SeqClassificationRM,
        "score",
        lambda self, *a, **k: scored.append(1) or real_score(self, *a, **k),
    )
    trainer = _trainer(task, tokenizer, tmp_path / "c", ours_rm, "datc")
    assert isinstance(trainer.reward_pass, GradientRewardModel)
    assert trainer.reward_funcs[0] is trainer.reward_pass and trainer.reward_pass.model is ours_rm
    trainer.train()
    assert len(stock_calls.rewards) == len(ours_calls.rewards) == 1
    assert torch.equal(ours_calls.rewards[0], stock_calls.rewards[0])
    assert ours_calls.forwards == stock_calls.forwards == 1
    assert scored == []
    logs = trainer.state.log_history[0]
    assert logs["credit/reward_grad_second_pass_frac"] == 0.0
    assert logs["credit/weight_max"] > 1.0  # the gradient reached the credit
    assert all(p.grad is None for p in ours_rm.parameters())


def test_the_gradient_is_that_of_trls_own_input_at_the_completion_tokens(
    task: TaskData, tokenizer: Any, tmp_path: Any, rm: torch.nn.Module
) -> None:
    """Recomputed row by row with the plain Hugging Face model on TRL's text (prompt +
    decoded completion, no special tokens): dR/d(input embeddings) at the positions of the
    completion's non-special tokens, 0 at the others (EOS, padding)."""
    trainer = _trainer(task, tokenizer, tmp_path, rm, "datc")
    seen: list[tuple[dict[str, Any], torch.Tensor]] = []
    real = trainer.reward_side

    def keep(batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        out = real(batch)
        seen.append((batch, out["reward_grad"]))
        return out

    trainer.reward_side = keep
    trainer.train()
    ((batch, grad),) = seen
    special = set(tokenizer.all_special_ids)
    table = rm.get_input_embeddings()
    checked = 0
    for i in range(grad.shape[0]):
        ids = batch["completion_ids"][i][batch["completion_mask"][i].bool()].tolist()
        read = [t for t in ids if t not in special]
        prompt = tokenizer.decode(batch["prompt_ids"][i][batch["prompt_mask"][i].bool()],
                                  skip_special_tokens=True)  # fmt: skip
        text = prompt + tokenizer.decode(ids, skip_special_tokens=True)
        rm_ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        x = table(rm_ids).detach().requires_grad_(True)
        (g,) = torch.autograd.grad(rm(inputs_embeds=x).logits[0, 0], x)
        row = rm_ids[0].tolist()
        assert row[len(row) - len(read) :] == read  # this tokenizer re-tokenizes cleanly
        expected = torch.zeros_like(grad[i])
        cols = [j for j, t in enumerate(batch["completion_ids"][i].tolist())
                if batch["completion_mask"][i][j] and t not in special]  # fmt: skip
        expected[cols] = g[0, len(row) - len(read) :]
        torch.testing.assert_close(grad[i], expected, rtol=1e-5, atol=1e-6)
        checked += int(len(read) > 0)
    assert checked > 0


def test_a_random_policys_rows_all_take_the_direction_models_pass(
    task: TaskData, tokenizer: Any, tmp_path: Any, rm: torch.nn.Module
) -> None:
    """Arbitrary token runs decode to text that re-tokenizes otherwise: no row is placed,
    each takes the direction model's own pass, and the credit still forms."""
    trainer = _trainer(task, tokenizer, tmp_path, rm, "datc", whole_words=False)
    trainer.train()
    logs = trainer.state.log_history[0]
    assert logs["credit/reward_grad_second_pass_frac"] == 1.0
    assert logs["credit/weight_max"] > 1.0


def test_rows_not_placed_take_the_direction_models_own_pass(
    task: TaskData, tokenizer: Any, tmp_path: Any, rm: torch.nn.Module
) -> None:
    """A row whose completion does not appear in the reward model's input gets the
    direction model's gradient; the placed rows keep the pass's; the share is logged."""
    trainer = _trainer(task, tokenizer, tmp_path, rm, "datc")
    trainer.model.train()
    g = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(5, 500, (2, 3), generator=g)
    completion_ids = torch.randint(5, 500, (2, 4), generator=g)
    ones = torch.ones(2, 4, dtype=torch.long)
    rm_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    rm_ids[1, -1] = 2  # row 1's last completion token is not what the RM read
    pass_grad = torch.randn(2, 7, trainer.direction.reward_embedding.shape[1], generator=g)
    trainer.reward_pass._passes = [RewardPass(rm_ids, torch.ones_like(rm_ids), pass_grad)]
    batch = {
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completion_ids,
        "completion_mask": ones,
    }
    grad = trainer.reward_side(batch)["reward_grad"]
    torch.testing.assert_close(grad[0], pass_grad[0, 3:])
    own = trainer.direction.score(prompt_ids[1:], ones[:1, :3], completion_ids[1:], ones[1:],
                                  with_grad=True).reward_grad  # fmt: skip
    torch.testing.assert_close(grad[1], own[0].float())
    assert trainer._metrics["train"]["credit/reward_grad_second_pass_frac"] == [0.5]


def test_completion_reward_grad_places_the_last_run_and_skips_special_tokens() -> None:
    """Special tokens (EOS, TRL drops them when decoding) and padding get 0; the completion
    is found at its last occurrence; an empty completion is matched with no gradient."""
    d = 2
    rm_ids = torch.tensor([[7, 8, 9, 7, 8, 0], [5, 6, 5, 6, 0, 0], [4, 4, 4, 4, 4, 4]])
    attention = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0], [1] * 6])
    grad = torch.arange(6 * 3 * d, dtype=torch.float32).reshape(3, 6, d)
    completion = torch.tensor([[7, 8, 1], [5, 6, 1], [1, 0, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]])
    out, matched = completion_reward_grad(
        RewardPass(rm_ids, attention, grad), completion, mask, torch.tensor([0, 1])
    )
    assert matched.tolist() == [True, True, True]
    torch.testing.assert_close(out[0, :2], grad[0, 3:5])  # the last run of 7, 8
    assert bool((out[0, 2] == 0).all())  # EOS
    torch.testing.assert_close(out[1, :2], grad[1, 2:4])
    assert bool((out[1, 2] == 0).all()) and bool((out[2] == 0).all())
    unmatched = torch.tensor([[9, 9, 9]])
    out, matched = completion_reward_grad(
        RewardPass(rm_ids[:1], attention[:1], grad[:1]), unmatched, mask[:1], torch.tensor([1])
    )
    assert matched.tolist() == [False] and bool((out == 0).all())


@pytest.mark.slow
def test_processes_whose_rows_differ_enter_the_same_zero3_gathers(
    tmp_path: Path, tokenizer: Any, rm: torch.nn.Module
) -> None:
    """Two gloo processes, a reward model whose every forward and backward is a collective
    (ZeRO-3's parameter all-gathers, faked and counted: ``zero3_worker.CountingGathers``):
    rank 0 has two rows TRL's reward pass could not place, rank 1 none; rank 0's prefix
    rewards need ``prefix_scores``' four chunks (a row at max_length), rank 1's fit in the
    reward forward. With the count agreement both enter the same gathers (no hang: a
    mismatch times out and fails) and each gets what it would alone."""
    rm.save_pretrained(tmp_path / "rm")
    tokenizer.save_pretrained(tmp_path / "rm")
    run_ranks(zero3_worker.main, tmp_path, (str(tmp_path / "rm"), str(tmp_path)), timeout=90)
    ranks = [json.loads((tmp_path / f"rank{k}.json").read_text()) for k in (0, 1)]
    assert ranks[0]["filled"] == 2 and ranks[1]["filled"] == 0
    for key in ("second_pass_gathers", "prefix_gathers", "gathers"):
        assert ranks[0][key] == ranks[1][key] > 0, key
    assert all(rank["grad_ok"] and rank["prefix_ok"] for rank in ranks)


def test_a_direction_model_of_zero3_partitions_agrees_on_its_passes(
    tokenizer: Any, rm: torch.nn.Module, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trainer turns the count agreement on where the direction model holds ZeRO-3
    parameters (TRL's reward model under ZeRO-3) and several processes run: the largest
    count of any process (one gather), also the direction model's own ``agree_count``; a
    whole direction model, or one process, gets none."""
    counts = torch.tensor([[1], [3]])
    accelerator = SimpleNamespace(num_processes=2, device=torch.device("cpu"))
    accelerator.gather = lambda mine: counts if int(mine) == 1 else None
    trainer: Any = SimpleNamespace(accelerator=accelerator)
    whole = SeqClassificationRM(copy.deepcopy(rm), tokenizer, policy_vocab_size=len(tokenizer))
    assert CreditGRPOTrainer.collective_agreement(trainer, whole) is None
    FakeZero3(monkeypatch).partition(*rm.parameters())
    direction = SeqClassificationRM(rm, tokenizer, policy_vocab_size=len(tokenizer))
    agree = CreditGRPOTrainer.collective_agreement(trainer, direction)
    assert agree is not None and direction.agree_count is agree and agree(1) == 3
    accelerator.num_processes = 1
    assert CreditGRPOTrainer.collective_agreement(trainer, direction) is None


@pytest.mark.slow
def test_under_real_deepspeed_zero3_the_one_pass_gives_stock_rewards_and_the_whole_models_gradient(
    tmp_path: Path, tokenizer: Any, rm: torch.nn.Module
) -> None:
    """Two gloo processes, each holding TRL's reward model as ``GRPOTrainer`` holds it under
    ZeRO-3 (``from_pretrained`` under the live DeepSpeed config: shape-[0] partitions; then
    TRL's own ``prepare_deepspeed``, a real engine, bf16), rows of their own: TRL's own
    ``_calculate_rewards`` with the ``GradientRewardModel`` gives rewards bitwise those with
    the engine (stock TRL) and the unpartitioned model's, from one forward and one backward
    of the reward model per process; the weights are partitions again after the pass (the
    engine's own forward refuses that backward: docs/trl.md, "One reward-model pass").
    Process 0 has a row that pass cannot place, process 1 none: with the trainer's count
    agreement (``collective_agreement``) both run the direction model's pass once (no
    hang), and the weights are partitions again after it. dR/dx, of the pass and of that
    row, is the unpartitioned model's to within half a bf16 step of its largest entry
    (2^-8 of it: not bitwise, as DeepSpeed's ZeRO-3 backward, its hook functions around
    every submodule, accumulates the bf16 gradients otherwise than plain autograd, with
    ``memory_efficient_linear`` on or off alike: measured about 2e-3; a gradient scaled
    for accumulation, as through the engine's own forward, would be 0.75 off)."""
    folder = save_checkpoint(rm.to(torch.bfloat16), tokenizer, tmp_path / "rm")
    cases = [("zero3", folder, 3, "bf16", False)]
    run_ranks(engine_worker.main, tmp_path, (cases, str(tmp_path)), timeout=240)
    ranks = [json.loads((tmp_path / f"zero3-rank{k}.json").read_text()) for k in (0, 1)]
    for rank in ranks:
        assert rank["partitioned"] and rank["released_after_pass"]
        assert rank["rewards_bitwise"] and rank["rewards_equal_unpartitioned"]
        assert rank["passes"] == [1, 1]
        assert rank["agrees"] and rank["fill_passes"] == [1, 1]
        assert rank["released_after_fill"]
        assert rank["grad_nonzero"] and rank["grad_error"] <= 2**-8 and rank["fill_error"] <= 2**-8
    assert ranks[0]["matched"] == [True, True, False] and ranks[0]["filled"] == 1
    assert ranks[1]["matched"] == [True, True] and ranks[1]["filled"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("case", list(STAGE0))
def test_under_deepspeed_without_zero3_the_one_pass_gives_stock_rewards_and_the_modules_gradient(
    stage0_records: dict[str, dict[str, Any]], case: str
) -> None:
    """TRL wraps a reward model in a DeepSpeed engine under any DeepSpeed config (stage 0
    unless ZeRO-3). Through the engine's own forward the backward was refused in fp32 and
    dR/dx came out divided by the gradient accumulation steps (4) in bf16; the pass runs the
    module inside the engine, under the engine's ``torch_autocast`` where it has one: TRL's
    rewards bitwise stock, dR/dx the model's own (under the same autocast)."""
    rank = stage0_records[case]
    assert rank["rewards_bitwise"] and rank["rewards_equal_unpartitioned"]
    assert rank["grad_nonzero"] and rank["grad_equals_unpartitioned"]
    assert rank["passes"] == [1, 1]
