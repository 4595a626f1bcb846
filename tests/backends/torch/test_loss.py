"""The clipped PPO loss, the loss aggregations and the KL estimators, against hand
computation and against OpenRLHF 0.11.2's own ``PolicyLoss`` / ``compute_approx_kl``."""

from __future__ import annotations

import importlib
import math
import sys
import types
from pathlib import Path

import pytest
import torch

from backends.torch.kl import kl_estimate
from backends.torch.loss import LossNormalizer, aggregate, ppo_clip_loss

MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)


def _inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(3, 4, generator=gen, dtype=torch.float64) * 3
    new = old + 0.4 * torch.randn(3, 4, generator=gen, dtype=torch.float64)
    adv = torch.randn(3, 4, generator=gen, dtype=torch.float64)
    return new, old, adv


def _openrlhf_models() -> tuple[types.ModuleType, types.ModuleType] | None:
    """OpenRLHF's ``models/loss.py`` and ``models/utils.py``, loaded without the package
    ``__init__`` (which imports its actor, flash-attn and deepspeed: ~20 s on this CPU).
    ``utils.py`` imports deepspeed only for a ZeRO-3 helper these tests never call, so a
    placeholder module stands in during the import unless deepspeed is already loaded."""
    try:
        import openrlhf
    except ImportError:
        return None
    folder = Path(openrlhf.__file__).parent / "models"
    name = "_openrlhf_models_for_tests"
    if name not in sys.modules:
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(folder)]
        sys.modules[name] = pkg
        placeholder = "deepspeed" not in sys.modules
        if placeholder:
            sys.modules["deepspeed"] = types.ModuleType("deepspeed")
        try:
            importlib.import_module(f"{name}.loss")
        finally:
            if placeholder:
                del sys.modules["deepspeed"]
    return sys.modules[f"{name}.loss"], sys.modules[f"{name}.utils"]


def test_ppo_clip_loss_matches_the_formula_token_by_token() -> None:
    new, old, adv = _inputs()
    terms = ppo_clip_loss(new, old, adv, clip_eps_low=0.2, clip_eps_high=0.28)
    for i in range(3):
        for t in range(4):
            r = math.exp(float(new[i, t] - old[i, t]))
            a = float(adv[i, t])
            clipped_r = min(max(r, 0.8), 1.28)
            expected = -min(r * a, clipped_r * a)
            assert float(terms.loss[i, t]) == pytest.approx(expected, rel=1e-12, abs=1e-12)
            assert bool(terms.clipped[i, t]) == (clipped_r * a < r * a)


def test_ppo_gradient_vanishes_exactly_where_the_clip_is_active() -> None:
    new, old, adv = _inputs(1)
    new = new.clone().requires_grad_(True)
    terms = ppo_clip_loss(new, old, adv, clip_eps_low=0.1, clip_eps_high=0.1)
    terms.loss.sum().backward()
    assert new.grad is not None
    ratio = (new - old).exp().detach()
    assert bool(terms.clipped.any()) and bool((~terms.clipped).any())
    assert torch.all(new.grad[terms.clipped] == 0)
    torch.testing.assert_close(new.grad[~terms.clipped], -(ratio * adv)[~terms.clipped])


def test_aggregations_by_hand() -> None:
    values = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    norm = LossNormalizer(num_tokens=9, num_seqs=3, max_len=8)
    valid = [[0, 1, 2], [4, 5], [8, 9, 10, 11]]
    token_mean = sum(map(sum, valid)) / 9
    seq_mean_token_mean = sum(sum(v) / len(v) for v in valid) / 3
    seq_mean_token_sum_norm = sum(map(sum, valid)) / (8 * 3)
    assert float(aggregate(values, MASK, "token_mean", norm)) == pytest.approx(token_mean)
    assert float(aggregate(values, MASK, "seq_mean_token_mean", norm)) == pytest.approx(
        seq_mean_token_mean
    )
    assert float(aggregate(values, MASK, "seq_mean_token_sum_norm", norm)) == pytest.approx(
        seq_mean_token_sum_norm
    )


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_micro_batch_shares_add_up_to_the_whole_batch_loss(mode: str) -> None:
    """Global normalizers make the sum over micro-batches equal the one-batch loss."""
    values = torch.randn(3, 4, dtype=torch.float64)
    norm = LossNormalizer(float(MASK.sum()), 3, 4)
    whole = aggregate(values, MASK, mode, norm)  # type: ignore[arg-type]
    parts = sum(aggregate(values[s], MASK[s], mode, norm) for s in (slice(0, 1), slice(1, 3)))  # type: ignore[arg-type]
    torch.testing.assert_close(whole, parts)


def test_padding_never_leaks_into_the_loss() -> None:
    values = torch.randn(3, 4, dtype=torch.float64)
    poisoned = values.masked_fill(~MASK, float("nan"))
    norm = LossNormalizer(float(MASK.sum()), 3, 4)
    for mode in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"):
        torch.testing.assert_close(
            aggregate(poisoned, MASK, mode, norm),
            aggregate(values, MASK, mode, norm),  # type: ignore[arg-type]
        )


def test_kl_estimators_by_hand() -> None:
    logp = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64)
    ref = torch.tensor([-1.5, -1.0, -0.5], dtype=torch.float64)
    d = [0.5, -1.0, 0.0]
    torch.testing.assert_close(kl_estimate(logp, ref, "k1"), torch.tensor(d, dtype=torch.float64))
    torch.testing.assert_close(
        kl_estimate(logp, ref, "k2"), torch.tensor([x * x / 2 for x in d], dtype=torch.float64)
    )
    torch.testing.assert_close(
        kl_estimate(logp, ref, "k3"),
        torch.tensor([math.exp(-x) - 1 + x for x in d], dtype=torch.float64),
    )


def test_kl_estimators_are_unbiased_or_not_as_documented() -> None:
    """Monte Carlo over y ~ p: k1 and k3 average to KL(p || q), k2 does not in general."""
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(6, generator=gen, dtype=torch.float64), 0)
    q = torch.softmax(torch.randn(6, generator=gen, dtype=torch.float64), 0)
    exact = float((p * (p / q).log()).sum())
    # expectation computed exactly by weighting every outcome with p(y)
    logp, logq = p.log(), q.log()
    assert float((p * kl_estimate(logp, logq, "k1")).sum()) == pytest.approx(exact, rel=1e-12)
    assert float((p * kl_estimate(logp, logq, "k3")).sum()) == pytest.approx(exact, rel=1e-12)
    assert float((p * kl_estimate(logp, logq, "k2")).sum()) != pytest.approx(exact, rel=1e-3)


def test_kl_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="ref_log_probs: expected shape"):
        kl_estimate(torch.zeros(2, 3), torch.zeros(2, 4), "k3")


@pytest.fixture(scope="module")
def openrlhf_models() -> tuple[types.ModuleType, types.ModuleType]:
    found = _openrlhf_models()
    if found is None:
        pytest.skip("openrlhf is not installed")
    return found


@pytest.mark.parametrize("token_level", [True, False])
def test_policy_loss_matches_openrlhf(
    openrlhf_models: tuple[types.ModuleType, types.ModuleType], token_level: bool
) -> None:
    loss_mod, _ = openrlhf_models
    new, old, adv = _inputs(2)
    ref_loss = loss_mod.PolicyLoss(
        clip_eps_low=0.2, clip_eps_high=0.28, token_level_loss=token_level
    )
    theirs, their_clip, their_ppo_kl, _, _ = ref_loss(new, old, adv, action_mask=MASK.double())
    terms = ppo_clip_loss(new, old, adv, clip_eps_low=0.2, clip_eps_high=0.28)
    mode = "token_mean" if token_level else "seq_mean_token_mean"
    norm = LossNormalizer(float(MASK.sum()), 3, 4)
    ours = aggregate(terms.loss, MASK, mode, norm)
    # OpenRLHF divides per-sequence sums by (n_i + 1e-8): a 1e-8 relative difference
    tol = 1e-12 if token_level else 1e-7
    torch.testing.assert_close(ours, theirs, rtol=tol, atol=1e-12)
    assert float((terms.clipped & MASK).sum() / MASK.sum()) == pytest.approx(float(their_clip))
    assert float((-terms.log_ratio * MASK).sum() / MASK.sum()) == pytest.approx(float(their_ppo_kl))


def test_global_normalizers_match_openrlhfs_data_parallel_form(
    openrlhf_models: tuple[types.ModuleType, types.ModuleType],
) -> None:
    """OpenRLHF's ``aggregate_loss`` with global totals and dp_size equals our share x world."""
    loss_mod, _ = openrlhf_models
    values = torch.randn(3, 4, dtype=torch.float64)
    norm = LossNormalizer(num_tokens=20.0, num_seqs=6, max_len=4)
    ours_tok = aggregate(values, MASK, "token_mean", norm) * 2
    theirs_tok = loss_mod.aggregate_loss(
        values, MASK.double(), True, dp_size=2, batch_num_tokens=20.0
    )
    torch.testing.assert_close(ours_tok, theirs_tok)
    ours_seq = aggregate(values, MASK, "seq_mean_token_mean", norm) * 2
    theirs_seq = loss_mod.aggregate_loss(
        values, MASK.double(), False, dp_size=2, global_batch_size=6
    )
    torch.testing.assert_close(ours_seq, theirs_seq, rtol=1e-7, atol=1e-9)


def test_seq_mean_token_sum_norm_relates_to_verl_as_documented() -> None:
    """verl: sum_{i,t} m l / T_pad per batch; ours divides that by the batch size."""
    values = torch.randn(3, 4, dtype=torch.float64)
    verl = (values * MASK).sum() / MASK.shape[-1]
    ours = aggregate(values, MASK, "seq_mean_token_sum_norm", LossNormalizer(9.0, 3, 4))
    torch.testing.assert_close(ours * 3, verl)


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_matches_openrlhf(
    openrlhf_models: tuple[types.ModuleType, types.ModuleType], estimator: str
) -> None:
    _, utils = openrlhf_models
    new, old, _ = _inputs(3)
    theirs = utils.compute_approx_kl(new, old, kl_estimator=estimator)
    ours = kl_estimate(new, old, estimator)  # type: ignore[arg-type]
    torch.testing.assert_close(ours, theirs.to(ours.dtype), rtol=1e-6, atol=1e-7)
