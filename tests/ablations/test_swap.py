"""The exact-swap oracle's work (``ablations.swap.swap_work``) and its signal
(``ablations.swap.swap_deltas``), docs/design.md, "Curvature-robust direction".

- For an RM linear in each input embedding, R = sum_t w_t . x_t, the exact swap differences
  are the first-order ones: with the whole vocabulary as candidates ``swap_work`` equals
  DATC's ``token_work`` with g_t = w_t (brute force against the closed form).
- ``swap_deltas`` against scoring every swapped response one at a time; candidates are the
  sampled token then the top-k others; padding and slot 0 hold 0.
- Allocated by the shared rule, the oracle keeps the invariants: sign, mean, padding.
"""

from __future__ import annotations

import pytest
import torch

from ablations.swap import swap_deltas, swap_work, top_candidates
from adapters.reward_models import ModuleRM
from credit_core import allocate_weights, policy_stats_from_logits, token_work

pytestmark = pytest.mark.usefixtures("single_torch_thread")

F64 = torch.float64
B, T, V, d = 3, 4, 6, 5


class LinearRM(torch.nn.Module):
    def __init__(self, w: torch.Tensor) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(w)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        L = x.shape[1]
        return ((x * self.w[:L]).sum(dim=2) * mask.to(x.dtype)).sum(dim=1)


class TanhRM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.v = torch.nn.Parameter(
            torch.randn(d, dtype=F64, generator=torch.Generator().manual_seed(5))
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m = mask.to(x.dtype).unsqueeze(2)
        return torch.tanh((x * m).sum(dim=1) @ self.v)


def _setup() -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    E = torch.randn(V, d, generator=gen, dtype=F64)
    ids = torch.randint(0, V, (B, T), generator=gen)
    mask = torch.arange(T).unsqueeze(0) < torch.tensor([[T], [2], [3]])
    logits = torch.randn(B, T, V, generator=gen, dtype=F64)
    prompt = torch.randint(0, V, (B, 2), generator=gen)
    return E, ids, mask, logits, prompt


def test_full_vocabulary_linear_rm_equals_datc_work() -> None:
    E, ids, mask, logits, prompt = _setup()
    w = torch.randn(T, d, dtype=F64, generator=torch.Generator().manual_seed(1))
    rm = ModuleRM(LinearRM(w), E, policy_vocab_size=V, include_prompt=False)
    probs = torch.softmax(logits, dim=2)
    swaps = swap_deltas(rm, prompt, torch.ones_like(prompt), ids, mask, probs, V - 1)
    adv = torch.tensor([1.0, -2.0, 0.5], dtype=F64)
    got = swap_work(swaps.probs, swaps.deltas, adv)
    stats = policy_stats_from_logits(logits, ids, E)
    want = token_work(stats, w.unsqueeze(0).expand(B, T, d), adv)
    torch.testing.assert_close(got[mask], want[mask], rtol=1e-9, atol=1e-12)


def test_swap_deltas_against_scoring_each_swap() -> None:
    E, ids, mask, logits, prompt = _setup()
    rm = ModuleRM(TanhRM(), E, policy_vocab_size=V, include_prompt=False)
    probs = torch.softmax(logits, dim=2)
    k = 2
    swaps = swap_deltas(rm, prompt, torch.ones_like(prompt), ids, mask, probs, k, chunk=5)
    cand, cand_p = top_candidates(probs, ids, k)
    torch.testing.assert_close(swaps.candidates, cand)
    assert bool((cand[..., 0] == ids).all()) and bool((cand[..., 1:] != ids.unsqueeze(2)).all())
    torch.testing.assert_close(swaps.probs, cand_p)
    ones = torch.ones(1, 2, dtype=torch.long)
    for b in range(B):
        r0 = float(
            rm.score(
                prompt[b : b + 1], ones, ids[b : b + 1], mask[b : b + 1], with_grad=False
            ).rewards[0]
        )
        for t in range(T):
            for j in range(k + 1):
                if not mask[b, t] or j == 0:
                    assert float(swaps.deltas[b, t, j]) == 0.0
                    continue
                y = ids[b : b + 1].clone()
                y[0, t] = cand[b, t, j]
                r = float(
                    rm.score(prompt[b : b + 1], ones, y, mask[b : b + 1], with_grad=False).rewards[
                        0
                    ]
                )
                assert float(swaps.deltas[b, t, j]) == pytest.approx(r - r0, abs=1e-12)


def test_oracle_allocation_keeps_the_invariants() -> None:
    E, ids, mask, logits, prompt = _setup()
    rm = ModuleRM(TanhRM(), E, policy_vocab_size=V, include_prompt=False)
    swaps = swap_deltas(rm, prompt, torch.ones_like(prompt), ids, mask, torch.softmax(logits, 2), 3)
    adv = torch.tensor([1.0, -2.0, 0.5], dtype=F64)
    w, _ = allocate_weights(
        swap_work(swaps.probs, swaps.deltas, adv), mask, beta=2.0, lam=0.5, on_nonfinite="error"
    )
    token_adv = adv.unsqueeze(1) * w
    torch.testing.assert_close((token_adv * mask).sum(1) / mask.sum(1), adv)
    assert bool((token_adv[~mask] == 0).all())
    assert bool(((token_adv * adv.unsqueeze(1))[mask] > 0).all())
