"""CreditGRPOTrainer against TRL's own GRPOTrainer (real TRL 1.16, CPU, tiny Llama)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from trl import GRPOTrainer

from adapters.grad_path import path_alphas, path_reward_grad
from backends.trl.capture import causal_lm_of
from backends.trl.tasks import PolicyPreset, TaskData, tiny_policy
from credit_core import CreditError, CreditSignals, assign_credit, get_strategy, policy_stats
from tests.backends.trl.conftest import make_trainer


def _losses(trainer: Any) -> list[float]:
    return [r["loss"] for r in trainer.state.log_history if "loss" in r]


def test_uniform_is_stock_trl_bit_for_bit(task: TaskData, tokenizer: Any, tmp_path: Any) -> None:
    # built and trained one after the other: Trainer seeds the global RNG when built
    stock = make_trainer(task, tokenizer, tmp_path / "s", stock=True, max_steps=3)
    stock.train()
    ours = make_trainer(task, tokenizer, tmp_path / "c", credit="uniform", max_steps=3)
    ours.train()
    assert ours.credit_phase == "generation"
    assert _losses(ours) == _losses(stock) and len(_losses(ours)) == 3
    theirs = dict(stock.model.named_parameters())
    for name, param in ours.model.named_parameters():
        assert torch.equal(param, theirs[name]), name
    initial = tiny_policy(PolicyPreset())[0].state_dict()
    moved = [n for n, p in ours.model.named_parameters() if not torch.equal(p, initial[n])]
    assert moved, "3 steps should have moved the parameters"
    logged = [r for r in ours.state.log_history if "credit/weight_max" in r]
    assert len(logged) == 3 and all(r["credit/weight_max"] == 1.0 for r in logged)


@pytest.fixture
def loss_inputs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """Records, at every call of TRL's ``GRPOTrainer._compute_loss``, the batch it received,
    the expected token advantages recomputed independently from that batch at the current
    parameters (``expected``), and the advantages TRL's loss read (``seen``)."""
    records: list[dict[str, Any]] = []
    original = GRPOTrainer._compute_loss

    def spy(self: Any, model: Any, inputs: dict[str, Any]) -> Any:
        record = {"A": inputs["advantages"].clone(), "expected": _recompute(self, inputs)}
        loss = original(self, model, inputs)
        record.update(seen=inputs["advantages"].clone(), mask=inputs["completion_mask"].bool())
        records.append(record)
        return loss

    monkeypatch.setattr(GRPOTrainer, "_compute_loss", spy)
    yield records


@torch.no_grad()
def _recompute(trainer: Any, inputs: dict[str, Any]) -> torch.Tensor:
    """credit_core's token advantages of a TRL loss batch: TRL's backbone call on the same
    inputs, ``policy_stats`` on the LM head, the direction model's gradient, ``assign_credit``.

    Where the batch already holds token advantages (credit formed at generation time), A is
    their row mean over the valid tokens (checked against TRL's A in the loss-phase test)."""
    mask = inputs["completion_mask"].bool()
    A = inputs["advantages"]
    if A.dim() == 2:
        A = A.sum(dim=1) / mask.sum(dim=1)
    lm = causal_lm_of(trainer.model)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    T = inputs["completion_ids"].shape[1]
    hidden = lm.base_model(input_ids=ids, attention_mask=attn).last_hidden_state[:, -T - 1 : -1]
    head = lm.get_output_embeddings()
    stats = policy_stats(
        hidden,
        head.weight,
        inputs["completion_ids"],
        trainer.direction.reward_embedding,
        temperature=trainer.temperature,
        lm_head_bias=head.bias,
    )
    strategy = get_strategy(trainer.credit_args.credit_config)
    rollout = (
        inputs["prompt_ids"],
        inputs["prompt_mask"],
        inputs["completion_ids"],
        inputs["completion_mask"],
    )
    if strategy.reward_grad_points:  # on the path to this forward's expected embeddings
        alphas = path_alphas(strategy.reward_grad_points)
        grad = path_reward_grad(trainer.direction, *rollout, stats.m1, alphas)
        grad = torch.where(inputs["completion_mask"].bool().unsqueeze(2), grad, 0.0)
    else:
        with torch.enable_grad():
            grad = trainer.direction.score(*rollout, with_grad=True).reward_grad
    return assign_credit(
        strategy,
        A,
        mask,
        inputs["completion_ids"],
        CreditSignals(reward_grad=grad, policy_stats=stats),
    ).token_advantages


@pytest.mark.parametrize("name", ["datc", "datc_mid"])
def test_datc_advantages_reaching_trl_loss_are_credit_cores(
    task: TaskData, tokenizer: Any, tmp_path: Any, loss_inputs: list[dict[str, Any]], name: str
) -> None:
    """``datc_mid``: the reward gradient at the midpoint to the expected embeddings of the
    policy at TRL's temperature, recomputed from the loss forward's own statistics."""
    trainer = make_trainer(
        task,
        tokenizer,
        tmp_path,
        credit={"name": name, "beta": 1.0, "lam": 0.5},
        per_device_train_batch_size=32,
        num_generations=8,
        max_completion_length=24,
        gradient_accumulation_steps=2,
        steps_per_generation=2,
        temperature=0.7,
    )
    assert trainer.credit_phase == "loss" and not trainer.takes_old_logp_forward
    assert trainer.alphas == ([0.5] if name == "datc_mid" else [])
    trainer.train()
    assert len(loss_inputs) == 4  # 2 steps x 2 micro-batches
    padded = 0
    for rec in loss_inputs:
        seen, mask, A = rec["seen"], rec["mask"], rec["A"]
        assert seen.shape == mask.shape and A.dim() == 1
        torch.testing.assert_close(seen, rec["expected"], rtol=1e-4, atol=1e-5)
        assert bool((seen[~mask] == 0).all())
        row_mean = seen.sum(dim=1) / mask.sum(dim=1)
        torch.testing.assert_close(row_mean, A.float(), rtol=1e-4, atol=1e-5)
        assert not torch.allclose(seen, A.unsqueeze(1) * mask)  # the credit is not uniform
        padded += int((~mask).any(dim=1).sum())
    assert padded > 0, "the seed should give some completions that end before the limit"
    logs = trainer.state.log_history[0]
    assert logs["credit/weight_max"] > 1.0 > logs["credit/weight_entropy"]


@pytest.mark.parametrize(
    ("credit", "points"), [("datc_mid", 1), ({"name": "datc_ig", "points": 3}, 3)]
)
def test_a_path_strategy_takes_points_rm_passes_per_scoring_chunk_and_no_reward_forward(
    task: TaskData,
    tokenizer: Any,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
    credit: Any,
    points: int,
) -> None:
    """TRL's reward functions give the reward: for the credit the direction model runs only
    its ``points`` forward + backward passes on the path per scoring chunk (one per loss
    micro-batch on-policy), never a scoring forward at the samples."""
    direction = task.direction
    calls = {"path": 0, "score": 0}
    real_path, real_score = direction.reward_from_embeds, direction.score

    def path(*args: Any, **kwargs: Any) -> Any:
        calls["path"] += 1
        return real_path(*args, **kwargs)

    def score(*args: Any, **kwargs: Any) -> Any:
        calls["score"] += 1
        return real_score(*args, **kwargs)

    monkeypatch.setattr(direction, "reward_from_embeds", path)
    monkeypatch.setattr(direction, "score", score)
    trainer = make_trainer(task, tokenizer, tmp_path, credit=credit, direction=direction)
    assert trainer.credit_phase == "loss"
    trainer.train()
    steps = 2  # max_steps 2, one generation batch and one loss micro-batch each
    # TRL's reward function is this same model: its one scoring forward per step (score ->
    # reward_from_embeds); the credit adds only the path's passes
    assert calls == {"score": steps, "path": steps + points * steps}


class ForwardCounter:
    """Counts forwards of the policy's backbone (every policy forward runs it, whether
    through the causal LM or on the backbone alone): TRL's fused-head forwards (log-probs)
    and the others (generation steps, and any forward that reads hidden states itself)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.fused = self.backbone = 0
        lm = causal_lm_of(model)
        lm.register_forward_pre_hook(self._count_fused, with_kwargs=True)
        lm.base_model.register_forward_pre_hook(self._count_backbone)

    @property
    def other(self) -> int:
        return self.backbone - self.fused

    def _count_fused(self, module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        self.fused += int(bool(kwargs.get("fused_lm_head")))

    def _count_backbone(self, module: Any, args: Any) -> None:
        self.backbone += 1


@pytest.mark.parametrize("credit", ["datc", "datc_mid", "entropy_top"])
@pytest.mark.parametrize(
    ("settings", "phase"),
    [({}, "loss"), ({"num_iterations": 2}, "generation")],
    ids=["default-on-policy", "num_iterations=2"],
)
def test_policy_signals_take_no_extra_policy_forward(
    task: TaskData,
    tokenizer: Any,
    tmp_path: Any,
    settings: dict[str, Any],
    phase: str,
    credit: str,
) -> None:
    """datc's hidden states, datc_mid's m1 (and its statistics) and entropy_top's entropies
    come from forwards TRL runs anyway."""
    fixed = {"generation_kwargs": {"min_new_tokens": 16}, **settings}  # same generate steps
    counts = []
    for stock in (True, False):
        trainer = make_trainer(
            task, tokenizer, tmp_path / str(stock), stock=stock, credit=credit, **fixed
        )
        counter = ForwardCounter(trainer.model)
        trainer.train()
        counts.append((counter.fused, counter.other))
        if not stock:
            assert trainer.credit_phase == phase
    assert counts[0] == counts[1], f"stock TRL {counts[0]} vs {credit} {counts[1]} (fused, other)"
    per_step = 1 if phase == "loss" else 3  # 2 iterations + TRL's old-log-prob forward / 2 steps
    assert counts[0][0] == 2 * per_step or phase == "generation"


@pytest.mark.parametrize("name", ["datc", "datc_mid"])
def test_datc_with_old_logp_forward_uses_its_statistics(
    task: TaskData, tokenizer: Any, tmp_path: Any, loss_inputs: list[dict[str, Any]], name: str
) -> None:
    """num_iterations=2: credit is formed at generation time from TRL's old-log-prob forward
    (for datc_mid: its m1 is the path's end); both iterations read the same token
    advantages, equal to credit_core's at the sampling parameters (the first iteration's
    loss batch)."""
    trainer = make_trainer(task, tokenizer, tmp_path, credit=name, num_iterations=2)
    assert trainer.credit_phase == "generation" and trainer.takes_old_logp_forward
    trainer.train()
    first, second = loss_inputs
    torch.testing.assert_close(first["seen"], first["expected"], rtol=1e-4, atol=1e-5)
    assert torch.equal(first["seen"], second["seen"])


def test_strategy_needing_signals_without_direction_names_the_key(
    task: TaskData, tokenizer: Any, tmp_path: Any
) -> None:
    from backends.trl import CreditGRPOConfig, CreditGRPOTrainer
    from tests.backends.trl.conftest import BASE

    args = CreditGRPOConfig(
        output_dir=str(tmp_path),
        credit="datc",
        num_generations=4,
        per_device_train_batch_size=4,
        **BASE,
    )
    with pytest.raises(CreditError, match=r"^direction: strategy 'datc'"):
        CreditGRPOTrainer(
            model=tiny_policy(PolicyPreset())[0],
            reward_funcs=task.reward,
            args=args,
            train_dataset=task.train,
            processing_class=tokenizer,
        )


def test_a_gate_is_refused_where_trls_only_reward_is_the_direction_model(
    task: TaskData, tokenizer: Any, tmp_path: Any
) -> None:
    """The direction model is TRL's only reward function (``DirectionReward``): its agreement
    is 1 by construction, so ``credit.gate`` would never act; refused, naming the key."""
    with pytest.raises(CreditError, match=r"^credit\.gate: the reward is the direction model's"):
        make_trainer(
            task, tokenizer, tmp_path, credit={"name": "datc", "gate": {"agreement": [0.2, 0.6]}}
        )


def test_a_gate_on_the_attribution_is_refused_when_trls_trainer_is_built(
    task: TaskData, tokenizer: Any, tmp_path: Any
) -> None:
    """TRL measures a generation batch before its micro-batches' attributions exist, so a
    gate ``measure: attribution`` is refused at start-up, naming the key, not ignored."""
    gate = {"agreement": [0.05, 0.4], "measure": "attribution"}
    with pytest.raises(CreditError, match=r"^credit\.gate\.measure: 'attribution' ranks the step"):
        make_trainer(task, tokenizer, tmp_path, credit={"name": "datc", "gate": gate})


@pytest.mark.parametrize("name", ["datc_shuffled", "random_top"])
def test_strategy_state_is_checkpointed_and_resumed(
    task: TaskData, tokenizer: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """datc_shuffled's and random_top's random streams are saved with TRL's checkpoint and
    restored on resume: 4 steps in one go and 2 + 2 resumed from checkpoint-2 end in the
    same stream state (fixed-length completions, so every step draws the same amount).

    datc_shuffled runs with ``credit.gate`` and a direction model of its own: the gate's EMA
    takes one measure per optimizer step (2 loss micro-batches each), is saved in the
    checkpoint (``RUN_STATE_FILE``) and the resumed run's first measure starts from it."""
    from backends.trl.credit import RUN_STATE_FILE, STRATEGY_STATE_FILE
    from credit_core.agreement_gate import AgreementGate
    from tests.backends.trl.conftest import SignalDirection

    gated = name == "datc_shuffled"
    before: list[float | None] = []  # the EMA each gate update starts from
    real_update = AgreementGate.update

    def update(self: AgreementGate, agreement: Any) -> float:
        before.append(self.ema)
        return real_update(self, agreement)

    monkeypatch.setattr(AgreementGate, "update", update)
    credit: dict[str, Any] = {"name": name, "seed": 3}
    if gated:
        credit["gate"] = {"agreement": [0.2, 0.6]}
    settings = {
        "credit": credit,
        "direction": SignalDirection(task.direction) if gated else None,
        "save_strategy": "steps",
        "save_steps": 2,
        "max_steps": 4,
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 2,
        "generation_kwargs": {"min_new_tokens": 16},
    }
    first = make_trainer(task, tokenizer, tmp_path / "a", **settings)
    first.train()
    checkpoint = tmp_path / "a" / "checkpoint-2"
    assert (checkpoint / STRATEGY_STATE_FILE).exists()
    assert (checkpoint / RUN_STATE_FILE).exists() == gated
    logs = [r for r in first.state.log_history if "credit/weight_max" in r]
    assert len(logs) == 4 and all(("credit/gate_alpha" in r) == gated for r in logs)
    assert len(before) == (4 if gated else 0)  # once per step, not per micro-batch
    saved = before[2] if gated else None
    before.clear()
    resumed = make_trainer(task, tokenizer, tmp_path / "b", **settings)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert torch.equal(resumed.strategy.generator.get_state(), first.strategy.generator.get_state())
    if gated:
        assert saved is not None and before[0] == saved
        assert torch.load(checkpoint / RUN_STATE_FILE) == {"gate": {"ema": saved}}
        assert resumed.credit.run.gate.ema == first.credit.run.gate.ema
    restarted = make_trainer(task, tokenizer, tmp_path / "c", **{**settings, "max_steps": 2})
    restarted.train()
    assert not torch.equal(
        restarted.strategy.generator.get_state(), first.strategy.generator.get_state()
    )


def test_direction_defaults_to_trl_reward_model(
    task: TaskData, tokenizer: Any, tmp_path: Any
) -> None:
    """With a reward model among reward_funcs, ``credit: datc`` alone is enough: the direction
    model wraps that model (shared weights) and the credit is uneven."""
    from adapters.reward_models import SeqClassificationRM
    from adapters.tiny import tiny_seq_classifier
    from backends.trl import CreditGRPOConfig, CreditGRPOTrainer
    from tests.backends.trl.conftest import BASE

    rm = tiny_seq_classifier("llama", len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    args = CreditGRPOConfig(
        output_dir=str(tmp_path), credit="datc", num_generations=4, max_steps=1,
        per_device_train_batch_size=8, max_completion_length=12, **BASE,
    )  # fmt: skip
    trainer = CreditGRPOTrainer(
        model=tiny_policy(PolicyPreset())[0], reward_funcs=rm, args=args,
        train_dataset=task.train, processing_class=tokenizer, reward_processing_classes=tokenizer,
    )  # fmt: skip
    assert isinstance(trainer.direction, SeqClassificationRM)
    assert trainer.direction.modules[0] is trainer.reward_funcs[0].model  # one shared pass
    trainer.train()
    assert trainer.state.log_history[0]["credit/weight_max"] > 1.0
