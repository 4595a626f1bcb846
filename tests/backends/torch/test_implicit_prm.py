"""PRIME in the native trainer (docs/design.md, "Implicit process rewards (PRIME)").

- The credit reads q_t = log pi_phi(y_t) - log pi_ref(y_t), equal to the log ratio computed
  by hand from both models' full logits at the rollout temperature.
- One update of pi_phi is one optimizer step on the written-out mean cross-entropy (plain
  SGD: the parameters after the step equal p - lr * autograd's gradient, clipped or not).
- A run trains: pi_phi changes, the policy takes as many forwards per step as GRPO's, the
  reference policy one no-grad pass per micro-batch (shared with the KL term when it is on),
  pi_phi one no-grad pass and one forward/backward per micro-batch.
- A resumed run continues pi_phi, its optimizer and everything else bit for bit; under DDP
  and FSDP (one gloo rank) pi_phi trains, checkpoints and resumes as unwrapped.
- A non-finite PRM loss stops the run before pi_phi's optimizer step.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from backends.torch.config import config_from_dict
from backends.torch.distributed import unwrap
from backends.torch.implicit_prm import ImplicitPRM
from backends.torch.trainer import GRPORecipe, train
from credit_core.trained_model import ImplicitPRMSpec
from tests.helpers.one_rank import join_one_rank_group
from tests.helpers.torch_tiny import comparable, crash_in_step_3, tiny_config

pytestmark = pytest.mark.usefixtures("single_torch_thread")

#: The tiny preset learns at lr ~1e-3 (its policy runs at 3e-3); the published 1e-6 of a 7B
#: model would leave a tiny random pi_phi where it started for these few steps.
PRIME = {"name": "prime", "prm_lr": 1e-3}


def _one_batch(recipe: GRPORecipe) -> Any:
    prompts, positions, groups = recipe._my_prompts(
        recipe.sampler.next_batch(), recipe.train_prompts
    )
    return recipe.rollout(prompts, positions, groups, group_size=4, greedy=False, tag="t")


def _full_logp(model: torch.nn.Module, batch: Any, temperature: float) -> torch.Tensor:
    """log p(y_t) (B, R) of the sampled tokens from the model's full logits; 0 at padding."""
    ids = torch.cat([batch.prompt_ids, batch.response_ids], dim=1)
    mask = torch.cat([batch.prompt_mask.long(), batch.response_mask.long()], dim=1)
    R = batch.response_len
    logits = model(input_ids=ids, attention_mask=mask).logits[:, -R - 1 : -1].double()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    picked = logp.gather(-1, batch.response_ids.unsqueeze(-1)).squeeze(-1)
    return torch.where(batch.response_mask, picked, 0.0)


def _perturb(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))


def test_the_credit_reads_the_log_ratio_of_pi_phi_to_the_reference_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tiny_config(tmp_path / "run", credit=PRIME, rollout={"temperature": 0.7})
    recipe = GRPORecipe(config_from_dict(cfg))
    seen: list[Any] = []
    from backends.common import credit as credit_module

    real = credit_module.assign_credit

    def spy(*a: Any, **k: Any) -> Any:
        seen.append(a[4])
        return real(*a, **k)

    monkeypatch.setattr(credit_module, "assign_credit", spy)  # CreditRun.apply's call
    try:
        assert recipe.prm is not None and recipe.ref_model is not None
        _perturb(recipe.prm.model, 1)  # pi_phi != pi_ref, as after some updates
        batch = _one_batch(recipe)
        recipe.signals(batch, recipe.train_prompts)
        with torch.no_grad():
            want = _full_logp(recipe.prm.model.module, batch, 0.7) - _full_logp(
                recipe.ref_model, batch, 0.7
            )
        got = seen[0].implicit_log_ratio
        assert float(want.abs().max()) > 0.05
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)
    finally:
        recipe.close()


@pytest.mark.parametrize("clip", [1e9, 1e-3])
def test_one_update_is_one_sgd_step_on_the_written_out_cross_entropy(
    tmp_path: Path, clip: float
) -> None:
    cfg = tiny_config(tmp_path / "run", credit=PRIME, algorithm={"micro_batch_size": 3})
    recipe = GRPORecipe(config_from_dict(cfg))
    try:
        assert recipe.prm is not None and recipe.ref_model is not None
        model = recipe.prm.model
        _perturb(model, 2)
        beta, lr = 0.5, 0.1
        spec = ImplicitPRMSpec(beta=beta, lr=lr, grad_clip=clip, threshold=0.0)
        prm = ImplicitPRM(
            model,
            torch.optim.SGD(model.parameters(), lr=lr),
            spec,
            recipe.ctx,
            temperature=1.0,
            micro_batch_size=3,
        )
        batch = _one_batch(recipe)
        labels = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.25])
        with torch.no_grad():
            ref = _full_logp(recipe.ref_model, batch, 1.0)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        # the loss written out: mean_i BCE(sigmoid(beta sum_t (log pi_phi - log pi_ref)), l_i)
        q = _full_logp(model.module, batch, 1.0) - ref
        s = beta * q.sum(dim=1)
        p = torch.sigmoid(s)
        loss = -(labels * torch.log(p) + (1 - labels) * torch.log(1 - p)).mean()
        grads = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
        norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads if g is not None))
        scale = min(1.0, clip / (float(norm) + 1e-6))
        update = prm.update(batch, ref.float(), labels)
        assert update.loss == pytest.approx(float(loss.detach()), rel=1e-5)
        assert update.grad_norm == pytest.approx(float(norm), rel=1e-4)
        assert (scale < 1.0) == (clip < 1.0)
        for (name, param), g in zip(model.named_parameters(), grads, strict=True):
            want = before[name] if g is None else before[name] - lr * scale * g
            torch.testing.assert_close(param.detach(), want, rtol=1e-4, atol=1e-6, msg=name)
        assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())
    finally:
        recipe.close()


def _count_forwards(tmp_path: Path, credit: Any, kl_coef: float) -> dict[str, int]:
    """Forwards (decoder passes) of the policy, the reference policy and pi_phi in one
    training step (rollout excluded); 2 micro-batches of 4."""
    cfg = tiny_config(
        tmp_path,
        steps=1,
        credit=credit,
        algorithm={"kl_coef": kl_coef, "micro_batch_size": 4},
    )
    recipe = GRPORecipe(config_from_dict(cfg))
    counts = {"policy": 0, "reference": 0, "pi_phi": 0}
    modules = {"policy": recipe.policy.model, "reference": recipe.ref_model}
    if recipe.prm is not None:
        modules["pi_phi"] = unwrap(recipe.prm.model).module
    # the decoder runs in every pass (a plain model's log-prob pass calls it alone)
    handles = [
        m.get_decoder().register_forward_hook(
            lambda *_, key=key: counts.__setitem__(key, counts[key] + 1)
        )
        for key, m in modules.items()
        if m is not None
    ]
    real_rollout = recipe.rollout

    def rollout_without_counting(*a: Any, **k: Any) -> Any:
        before = dict(counts)
        out = real_rollout(*a, **k)
        counts.update(before)
        return out

    recipe.rollout = rollout_without_counting  # type: ignore[method-assign]
    try:
        recipe.run()
    finally:
        for h in handles:
            h.remove()
        recipe.close()
    return counts


@pytest.mark.parametrize("kl_coef", [0.0, 0.05])
def test_forwards_per_step_are_grpos_plus_the_reference_and_two_of_pi_phi(
    tmp_path: Path, kl_coef: float
) -> None:
    grpo = _count_forwards(tmp_path / "grpo", "uniform", kl_coef)
    prime = _count_forwards(tmp_path / "prime", PRIME, kl_coef)
    micro = 2  # 8 responses, micro-batches of 4
    assert prime["policy"] == grpo["policy"] > 0
    assert grpo["reference"] == (micro if kl_coef > 0 else 0)
    assert prime["reference"] == micro  # one pass, shared with the KL term when it is on
    assert prime["pi_phi"] == 2 * micro  # no-grad for the credit, then the update's forward


def test_prime_trains_and_its_implicit_prm_moves_away_from_the_reference(tmp_path: Path) -> None:
    recipe = GRPORecipe(config_from_dict(tiny_config(tmp_path / "run", credit=PRIME)))
    try:
        assert recipe.prm is not None and recipe.ref_model is not None
        ref = {n: p.detach().clone() for n, p in recipe.ref_model.named_parameters()}
        result = recipe.run()
        moved = [
            float((p.detach() - ref[n]).abs().max())
            for n, p in unwrap(recipe.prm.model).module.named_parameters()
        ]
        for n, p in recipe.ref_model.named_parameters():  # the reference stays frozen
            assert torch.equal(p, ref[n]), n
    finally:
        recipe.close()
    assert max(moved) > 1e-4
    assert [int(r["step"]) for r in result.history] == [1, 2, 3]
    for record in result.history:
        assert 0.0 < record["implicit_prm/loss"] < 5.0
        assert record["implicit_prm/grad_norm"] > 0.0
        assert 0.0 <= record["implicit_prm/accuracy"] <= 1.0
        assert "kl/ref" not in record  # the reference pass serves the credit only


RESUMABLE_PRIME: dict[str, Any] = {
    "steps": 4,
    "credit": {**PRIME, "threshold": 0.1},
    "algorithm": {"ppo_epochs": 2, "micro_batch_size": 3},
    "optim": {"lr": 3e-3, "schedule": "linear", "warmup_steps": 1},
    "checkpoint": {"interval": 1, "keep_last": 2},
}


def _state(recipe: GRPORecipe) -> dict[str, torch.Tensor]:
    assert recipe.prm is not None
    out = {f"pi_phi/{n}": p.detach().clone() for n, p in recipe.prm.model.named_parameters()}
    for i, st in enumerate(recipe.prm.optimizer.state.values()):
        for k, v in st.items():
            out[f"pi_phi_optim/{i}/{k}"] = torch.as_tensor(v).clone()
    out.update({f"policy/{n}": p.detach().clone() for n, p in recipe.model.named_parameters()})
    return out


def test_a_resumed_prime_run_continues_pi_phi_and_its_optimizer_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = GRPORecipe(config_from_dict(tiny_config(tmp_path / "full", **RESUMABLE_PRIME)))
    try:
        reference = full.run()
        want = _state(full)
    finally:
        full.close()

    run = tmp_path / "run"
    cfg = tiny_config(run, **RESUMABLE_PRIME)
    crash_in_step_3(cfg, monkeypatch)
    resumed = GRPORecipe(config_from_dict(cfg), resume=True)
    try:
        assert resumed.step == 2
        result = resumed.run()
        got = _state(resumed)
    finally:
        resumed.close()
    assert [comparable(r) for r in result.history] == [comparable(r) for r in reference.history[2:]]
    assert got.keys() == want.keys()
    for key in want:
        assert torch.equal(got[key], want[key]), key


@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_under_fsdp_and_ddp_pi_phi_trains_checkpoints_and_resumes_as_unwrapped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, strategy: str
) -> None:
    """One rank in a gloo group: pi_phi is wrapped like the policy (DDP, or FSDP2 shards),
    its gradient synchronised, its state saved and loaded as DCP shards; steps 1-2, then a
    resume to step 3, give the unwrapped run's figures."""
    updates: dict[str, Any] = {
        "credit": PRIME,
        "algorithm": {"micro_batch_size": 3},
        "checkpoint": {"interval": 1},
    }
    plain = train(tiny_config(tmp_path / "plain", **updates))
    join_one_rank_group(monkeypatch)
    wrapped_cfg = tiny_config(
        tmp_path / "wrapped", steps=2, distributed={"strategy": strategy}, **updates
    )
    train(wrapped_cfg)
    join_one_rank_group(monkeypatch)
    resumed = train({**wrapped_cfg, "steps": 3}, resume=True)
    assert [int(r["step"]) for r in resumed.history] == [3]
    one, two = plain.history[-1], resumed.history[-1]
    for key in ("implicit_prm/loss", "implicit_prm/grad_norm", "loss/policy", "reward/mean"):
        assert two[key] == pytest.approx(one[key], rel=1e-4, abs=1e-6), key


def test_a_non_finite_prm_loss_stops_before_the_optimizer_step(tmp_path: Path) -> None:
    recipe = GRPORecipe(config_from_dict(tiny_config(tmp_path / "run", credit=PRIME)))
    try:
        assert recipe.prm is not None
        batch = _one_batch(recipe)
        before = [p.detach().clone() for p in recipe.prm.model.parameters()]
        ref = torch.zeros(batch.size, batch.response_len)
        ref[0, 0] = -math.inf  # q = +inf: the score saturates to a non-finite loss
        with pytest.raises(FloatingPointError, match="implicit PRM: non-finite loss"):
            recipe.prm.update(batch, ref, torch.zeros(batch.size))
        for p, b in zip(recipe.prm.model.parameters(), before, strict=True):
            assert torch.equal(p, b)
    finally:
        recipe.close()
