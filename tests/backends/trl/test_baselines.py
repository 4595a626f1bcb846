"""The baseline strategies under TRL (real TRL 1.16, CPU, tiny Llama): ``entropy_top`` in
mask mode trains exactly as TRL's own ``top_entropy_quantile``; every strategy computes only
the signals it reads; ``abc`` needs a direction model with attention."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import torch
from trl import GRPOTrainer

import backends.common.credit as credit_module
import backends.trl.trainer as trainer_module
from backends.trl.credit import process_gather
from backends.trl.tasks import PolicyPreset, TaskData, tiny_policy
from credit_core import CreditError
from tests.backends.trl.conftest import SignalDirection, make_trainer


def _losses(trainer: Any) -> list[float]:
    return [r["loss"] for r in trainer.state.log_history if "loss" in r]


@pytest.fixture(scope="module")
def saved_policy(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny policy saved to disk (TRL builds the KL reference model from the path)."""
    path = tmp_path_factory.mktemp("policy")
    tiny_policy(PolicyPreset())[0].save_pretrained(path)
    return str(path)


@pytest.mark.parametrize(
    "settings",
    [
        # two micro-batches per generation (and per optimizer step), TRL's default loss dapo
        {"gradient_accumulation_steps": 2, "per_device_train_batch_size": 8},
        # TRL adds the KL term after its entropy mask: the KL is never masked in either
        {"loss_type": "grpo", "beta": 0.04, "model": "saved"},
        {"loss_type": "bnpo"},
    ],
    ids=["dapo-2-micro-batches", "grpo-kl", "bnpo"],
)
def test_entropy_top_mask_is_stock_trl_top_entropy_quantile(
    task: TaskData, tokenizer: Any, tmp_path: Path, saved_policy: str, settings: dict[str, Any]
) -> None:
    """Same seed, 3 steps: the same losses and the same final parameters, bit for bit. The
    token advantages are formed in each loss micro-batch from TRL's own entropies, with the
    quantile over that micro-batch (every process), as TRL's ``get_high_entropy_mask``."""
    if settings.get("model") == "saved":
        settings = {**settings, "model": saved_policy}
    common = {"max_steps": 3, **settings}
    # built and trained one after the other: Trainer seeds the global RNG when built
    stock = make_trainer(
        task, tokenizer, tmp_path / "s", stock=True, top_entropy_quantile=0.2, **common
    )
    stock.train()
    ours = make_trainer(
        task, tokenizer, tmp_path / "c", credit={"name": "entropy_top", "mode": "mask"}, **common
    )
    ours.train()
    assert ours.credit_phase == "loss" and ours.direction is None and ours._capture is None
    assert _losses(ours) == _losses(stock) and len(_losses(ours)) == 3
    theirs = dict(stock.model.named_parameters())
    for name, param in ours.model.named_parameters():
        assert torch.equal(param, theirs[name]), name
    logged = [r for r in ours.state.log_history if "credit/weight_min" in r]
    assert logged and all(r["credit/weight_min"] == 0.0 for r in logged)  # tokens masked out
    assert all(r["credit/weight_max"] == 1.0 for r in logged)


def test_entropy_top_with_old_logp_forward_uses_its_entropies(
    task: TaskData, tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """num_iterations=2: the selection is formed once per generation from TRL's
    old-log-prob forward (the sampling parameters); at the first iteration it equals TRL's
    ``get_high_entropy_mask`` of that loss batch, and the second iteration reads the same."""
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    original = GRPOTrainer._compute_loss

    def spy(self: Any, model: Any, inputs: dict[str, Any]) -> Any:
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        T = inputs["completion_ids"].shape[1]
        with torch.no_grad():  # TRL's own forward, bypassing the trainer's hand-over
            _, entropies, _ = GRPOTrainer._get_per_token_logps_and_entropies(
                self, model, ids, attn, T, compute_entropy=True
            )
        trl_mask = self.get_high_entropy_mask(entropies, inputs["completion_mask"], 0.8)
        seen.append((inputs["advantages"].clone(), trl_mask))
        return original(self, model, inputs)

    monkeypatch.setattr(GRPOTrainer, "_compute_loss", spy)
    trainer = make_trainer(
        task, tokenizer, tmp_path, credit="entropy_top", num_iterations=2, max_steps=2
    )
    assert trainer.credit_phase == "generation" and trainer.takes_old_logp_forward
    trainer.train()
    (first, trl_mask), (second, _) = seen
    assert first.dim() == 2 and torch.equal(first, second)
    rows = (first != 0).any(dim=1)  # rows with A != 0: their nonzero tokens are the selection
    assert int(rows.sum()) > 0
    assert torch.equal(first[rows] != 0, trl_mask[rows])
    assert bool((first[~trl_mask] == 0).all())


STRATEGIES: dict[str, tuple[Any, frozenset[str], str]] = {
    "uniform": ("uniform", frozenset(), "generation"),
    "entropy_top": (
        {"name": "entropy_top", "mode": "weight"},
        frozenset({"token_entropy"}),
        "loss",
    ),
    "random_top": ({"name": "random_top", "seed": 1}, frozenset(), "generation"),
    "abc": ("abc", frozenset({"reward_attention"}), "generation"),
    "red": ({"name": "red", "eps": 0.01}, frozenset({"prefix_rewards"}), "generation"),
    # reads the step's rewards and groups, given at generation time (TrlCredit.groups)
    "ktae": ("ktae", frozenset(), "generation"),
}


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_each_strategy_trains_reading_only_its_signals(
    task: TaskData, tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """Two steps per strategy: ``assign_credit`` gets exactly the signals the strategy reads;
    no hidden states are recorded and no policy statistics are reduced; the direction model
    is scored (once per generation batch, without grad) only for the attention or the
    prefix rewards that abc or red read; the credit is uneven except for uniform."""
    credit, signals, phase = STRATEGIES[name]
    computed: list[frozenset[str]] = []
    real = credit_module.assign_credit

    def spy(strategy: Any, *args: Any, **kwargs: Any) -> Any:
        computed.append(args[3].computed)
        return real(strategy, *args, **kwargs)

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("policy statistics were reduced")

    monkeypatch.setattr(credit_module, "assign_credit", spy)
    monkeypatch.setattr(trainer_module, "policy_stats", refused)
    monkeypatch.setattr(trainer_module, "unsigned_work", refused)
    direction = SignalDirection(task.direction)
    trainer = make_trainer(task, tokenizer, tmp_path, credit=credit, direction=direction)
    assert trainer.credit_phase == phase and trainer._capture is None
    trainer.train()
    assert computed and all(c == signals for c in computed)
    asked = {"grad": False, "attention": name == "abc", "prefix": name == "red"}
    assert direction.calls == ([asked] * 2 if name in ("abc", "red") else [])
    assert (trainer.direction is direction) == (name in ("abc", "red"))
    logs = [r for r in trainer.state.log_history if "credit/weight_max" in r]
    assert len(logs) == 2
    spread = max(r["credit/weight_max"] - r["credit/weight_min"] for r in logs)
    assert (spread == 0.0) == (name == "uniform")
    # abc and red read a direction model of their own: its agreement with TRL's reward on
    # each step's 4 groups, 1 (SignalDirection's scores are the reward's, from its own
    # pass); the others read no direction model and log no agreement
    measured = name in ("abc", "red")
    for r in logs:
        assert ("credit/direction_is_reward" in r) == measured
        if measured:
            assert r["credit/direction_is_reward"] == 0.0
            assert r["credit/agreement_groups"] + r["credit/agreement_skipped"] == 4
            assert r["credit/agreement_groups"] > 0 and r["credit/direction_agreement"] == 1.0


def test_abc_without_attention_is_refused(task: TaskData, tokenizer: Any, tmp_path: Path) -> None:
    with pytest.raises(
        CreditError,
        match=r"^direction: strategy 'abc' reads the direction model's attention "
        r"\(reward_attention\), but SignalDirection gives none",
    ):
        make_trainer(
            task,
            tokenizer,
            tmp_path,
            credit="abc",
            direction=SignalDirection(task.direction, attention=False),
        )


class TwoProcesses:
    """An accelerator of two processes seen from process 0; the other process contributes
    ``other`` to each gather (its length first, then its values padded as sent)."""

    num_processes = 2

    def __init__(self, other: torch.Tensor) -> None:
        self.other = other

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.dtype == torch.long:
            return torch.cat([tensor, torch.tensor([self.other.numel()])])
        theirs = torch.zeros_like(tensor)
        theirs[: self.other.numel()] = self.other
        return torch.cat([tensor, theirs])


def test_process_gather_joins_values_of_any_length() -> None:
    assert process_gather(type("One", (), {"num_processes": 1})()) is None
    other = torch.tensor([5.0, -1.0, 0.25], dtype=torch.float64)
    gather = process_gather(TwoProcesses(other))
    assert gather is not None
    mine = torch.tensor([0.1, 0.7], dtype=torch.float32)
    joined = gather(mine)
    assert joined.dtype == torch.float32
    assert torch.equal(joined, torch.cat([mine, other.float()]))
    assert torch.equal(gather(torch.zeros(0)), other.float())  # a process without tokens
    long_mine = torch.arange(6, dtype=torch.float64)
    assert torch.equal(gather(long_mine), torch.cat([long_mine, other]))


def test_a_process_without_valid_tokens_still_joins_the_quantile(
    task: TaskData, tokenizer: Any, tmp_path: Path
) -> None:
    """All rows masked out on this process (truncated completions): entropy_top's token
    advantages are 0, its diagnostics are not logged, and the process still takes part in
    the other processes' gather; uniform, which gathers nothing, does not."""
    from backends.common.credit import CreditRun
    from backends.trl.credit import BACKEND
    from credit_core import CreditSignals
    from credit_core.plan import CreditPlan

    trainer = make_trainer(task, tokenizer, tmp_path, credit="entropy_top")
    sent: list[torch.Tensor] = []
    trainer.credit.gather = lambda values: sent.append(values) or values
    batch = {"advantages": torch.ones(2), "completion_ids": torch.zeros(2, 3, dtype=torch.long)}
    mask = torch.zeros(2, 3, dtype=torch.bool)
    signals = CreditSignals(token_entropy=torch.ones(2, 3))
    result = trainer.credit.apply(batch, mask, signals)
    assert not bool(result.token_advantages.any())
    metrics: dict[str, list[float]] = defaultdict(list)
    trainer.credit.log_diagnostics(metrics, result.diagnostics)
    assert not metrics
    assert [v.numel() for v in sent] == [0]
    uniform = CreditRun(CreditPlan.build("uniform", BACKEND))
    trainer.credit.apply(batch, mask, CreditSignals(), uniform)
    assert len(sent) == 1
