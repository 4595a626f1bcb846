"""``answer_saliency``: OAR-G's s_t = |dJ/de_t . e_t| (docs/design.md, "Answer-gradient
reweighting (OAR-G)") against an independent autograd computation of J written out here: the
model's full logits on ``inputs_embeds`` with the same noise, the logits averaged over the
positions predicting the answer tokens, KL(p0 || p_noisy), ``torch.autograd.grad`` to the
clean embeddings."""

from __future__ import annotations

import pytest
import torch

from adapters.answer_saliency import answer_saliency
from adapters.policy import position_ids_from_mask
from adapters.tiny import tiny_causal_lm
from credit_core import CreditError

V, P, R = 48, 3, 7
NOISE = 1e-2


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three rows, left-padded prompts of lengths 3, 2, 3 and responses of 7, 5, 6 tokens;
    answer spans: positions 5-6, 4, and none (row 2 has no answer)."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1, V, (3, P + R), generator=gen)
    mask = torch.ones(3, P + R, dtype=torch.long)
    mask[1, 0] = 0
    mask[1, P + 5 :] = 0
    mask[2, P + 6 :] = 0
    ids = torch.where(mask.bool(), ids, 0)
    answer = torch.zeros(3, R, dtype=torch.bool)
    answer[0, 5:7] = True
    answer[1, 4] = True
    return ids, mask, answer


def _reference(
    model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, answer: torch.Tensor, seed: int
) -> torch.Tensor:
    """s (B, R) by autograd on ``inputs_embeds``, one row at a time, from the full logits."""
    B, L = ids.shape
    e = model.get_input_embeddings()(ids).detach()
    eps = torch.randn(e.shape, generator=torch.Generator().manual_seed(seed)) * NOISE
    out = torch.zeros(B, R)
    pos = position_ids_from_mask(mask)
    for b in range(B):
        answer_tokens = [P + j for j in range(R) if answer[b, j]]
        if not answer_tokens:
            continue
        first = answer_tokens[0]
        reasoning = [t for t in range(P, first) if mask[b, t]]
        predictors = []
        for t in answer_tokens:  # the position that predicts token t: the last real one before
            q = t - 1
            while not mask[b, q]:
                q -= 1
            predictors.append(q)
        noise = torch.zeros(L, e.shape[2])
        noise[reasoning] = eps[b, reasoning]
        x = e[b : b + 1].clone().requires_grad_(True)

        def answer_logp(
            inputs: torch.Tensor, b: int = b, predictors: list[int] = predictors
        ) -> torch.Tensor:
            logits = model(
                inputs_embeds=inputs, attention_mask=mask[b : b + 1], position_ids=pos[b : b + 1]
            ).logits[0]
            return torch.log_softmax(logits[predictors].mean(dim=0), dim=-1)

        with torch.no_grad():
            logp0 = answer_logp(x)
        J = (logp0.exp() * (logp0 - answer_logp(x + noise))).sum()
        (g,) = torch.autograd.grad(J, x)
        s = (g[0] * x[0].detach()).sum(-1).abs()
        for t in reasoning:
            out[b, t - P] = s[t]
    return out


def test_the_saliency_is_the_autograd_gradient_of_the_answer_kl_at_the_perturbed_point() -> None:
    model = tiny_causal_lm("llama", V, seed=0, pad_token_id=0).eval()
    ids, mask, answer = _batch()
    s = answer_saliency(
        model, ids, mask, R, answer, noise_std=NOISE, generator=torch.Generator().manual_seed(5)
    )
    expected = _reference(model, ids, mask, answer, seed=5)
    torch.testing.assert_close(s, expected, rtol=1e-4, atol=1e-9)
    assert bool((s[0, :5] > 0).all()) and bool((s[1, :4] > 0).all())
    assert not bool(s[0, 5:].any()) and not bool(s[1, 4:].any())  # the answer and after: 0
    assert not bool(s[2].any())  # no answer: no signal
    assert all(p.requires_grad and p.grad is None for p in model.parameters())


def test_the_noise_is_needed_at_the_clean_point_the_gradient_vanishes() -> None:
    """KL(p0 || p) is at its minimum where p = p0: the gradient is taken at the perturbed
    point, and it shrinks with the noise (first order in sigma; float64, small sigma)."""
    model = tiny_causal_lm("llama", V, seed=0, pad_token_id=0, dtype=torch.float64).eval()
    ids, mask, answer = _batch()

    def s(sigma: float) -> torch.Tensor:
        gen = torch.Generator().manual_seed(5)
        return answer_saliency(model, ids, mask, R, answer, noise_std=sigma, generator=gen)

    big, small = s(1e-3), s(1e-4)
    for b, n in ((0, 5), (1, 4)):
        ratio = small[b, :n].sum() / big[b, :n].sum()
        assert 0.08 < float(ratio) < 0.13


def test_no_answer_anywhere_takes_no_forward_and_gives_zeros() -> None:
    model = tiny_causal_lm("llama", V, seed=0, pad_token_id=0).eval()
    ids, mask, _ = _batch()
    calls = []
    handle = model.register_forward_hook(lambda *_: calls.append(1))
    try:
        none = torch.zeros(3, R, dtype=torch.bool)
        gen = torch.Generator().manual_seed(0)
        s = answer_saliency(model, ids, mask, R, none, noise_std=NOISE, generator=gen)
    finally:
        handle.remove()
    assert not bool(s.any()) and s.shape == (3, R) and not calls


def test_bad_answer_masks_are_refused_naming_them() -> None:
    model = tiny_causal_lm("llama", V, seed=0, pad_token_id=0).eval()
    ids, mask, answer = _batch()
    gen = torch.Generator()
    with pytest.raises(CreditError, match="answer_mask"):
        answer_saliency(model, ids, mask, R, answer[:, :3], noise_std=NOISE, generator=gen)
    at_padding = answer.clone()
    at_padding[1, 6] = True  # row 1 has 5 response tokens
    with pytest.raises(CreditError, match="answer_mask: expected answer tokens among the real"):
        answer_saliency(model, ids, mask, R, at_padding, noise_std=NOISE, generator=gen)
    with pytest.raises(CreditError, match="noise_std"):
        answer_saliency(model, ids, mask, R, answer, noise_std=0.0, generator=gen)
