"""The credit-quality probes (``ablations.credit_probes``), docs/design.md, "When token
credit pays off".

- Exact token credit, within-response correlation, cosine, leave-one-out baseline and the
  batch policy gradient against hand-computed values on small fixed batches.
- Both probes fail when the token advantages are permuted: on a categorical policy with an
  additive reward, the exact token credit correlates 1 with itself and its batch gradient
  points along the exact gradient of E[r] (computed in closed form), while the same
  advantages permuted within each response score far lower on both.
"""

from __future__ import annotations

import math

import pytest
import torch

from ablations.credit_probes import (
    cosine,
    exact_token_credit,
    flat_policy_gradient,
    leave_one_out,
    within_response_corr,
)
from credit_core.builtin_strategies import permute_within_rows

pytestmark = pytest.mark.usefixtures("single_torch_thread")


def test_exact_token_credit_by_hand() -> None:
    values = torch.tensor([[[0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.5, 0.0, 1.0]]])
    probs = torch.tensor([[[0.5, 0.25, 0.25], [0.2, 0.3, 0.5], [0.1, 0.1, 0.8]]])
    ids = torch.tensor([[1, 0, 0]])
    mask = torch.tensor([[True, True, False]])
    c = exact_token_credit(values, probs, ids, mask)
    # t=0: 1 - 0.25; t=1: nothing is worth anything; t=2: padding
    torch.testing.assert_close(c, torch.tensor([[0.75, 0.0, 0.0]], dtype=torch.float64))


def test_within_response_corr_by_hand() -> None:
    a = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 4.0, 4.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    c = torch.tensor([[1.0, 2.0, 4.0, 0.0], [1.0, 2.0, 3.0, 0.0], [5.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)
    # row 0: centered a (-1, 0, 1), c (-4/3, -1/3, 5/3): 3 / (sqrt 2 * sqrt(42) / 3)
    # row 1: constant a, left out; row 2: one token, left out
    assert within_response_corr(a, c, mask) == pytest.approx(9 / math.sqrt(84), abs=1e-12)
    assert math.isnan(within_response_corr(a[1:], c[1:], mask[1:]))


def test_cosine_and_leave_one_out_by_hand() -> None:
    assert cosine(torch.tensor([1.0, 0.0]), torch.tensor([1.0, 1.0])) == pytest.approx(
        1 / math.sqrt(2)
    )
    assert math.isnan(cosine(torch.zeros(2), torch.ones(2)))
    loo = leave_one_out(torch.tensor([1.0, 2.0, 6.0, 0.0, 0.0, 3.0]), 3)
    expected = [1 - 4, 2 - 3.5, 6 - 1.5, 0 - 1.5, 0 - 1.5, 3 - 0]
    torch.testing.assert_close(loo, torch.tensor(expected, dtype=torch.float64))


def test_flat_policy_gradient_by_hand() -> None:
    theta = torch.tensor([0.0, math.log(3.0)], requires_grad=True)  # p = (1/4, 3/4)
    ids = torch.tensor([[0, 1], [1, 1]])
    logp = torch.log_softmax(theta, dim=0)[ids]
    adv = torch.tensor([[2.0, 1.0], [-1.0, 5.0]])
    mask = torch.tensor([[True, True], [True, False]])
    g = flat_policy_gradient(logp, adv, mask, [theta])
    # d log p_y / d theta = e_y - p; (1/B) sum A_t (e_y - p) over valid tokens, B = 2
    p = torch.tensor([0.25, 0.75], dtype=torch.float64)
    e = torch.eye(2, dtype=torch.float64)
    want = (2 * (e[0] - p) + 1 * (e[1] - p) - 1 * (e[1] - p)) / 2
    torch.testing.assert_close(g, want)


def test_both_probes_fail_when_token_advantages_are_permuted() -> None:
    gen = torch.Generator().manual_seed(0)
    T, V = 6, 4
    theta = torch.randn(T, V, generator=gen, dtype=torch.float64, requires_grad=True)
    values = torch.randn(T, V, generator=gen, dtype=torch.float64)  # r(y) = sum_t values[t, y_t]
    p = torch.softmax(theta.detach(), dim=1)
    # exact gradient of E[r] = sum_t p_t . values_t w.r.t. theta_t: (diag p - p p^T) values_t
    exact = torch.stack(
        [(torch.diag(p[t]) - torch.outer(p[t], p[t])) @ values[t] for t in range(T)]
    ).flatten()
    corr_good, corr_bad, cos_good, cos_bad = [], [], [], []
    for _ in range(20):  # batches of 64 responses, the size of a training batch
        N = 64
        ids = torch.multinomial(p, N, replacement=True, generator=gen).T  # (N, T)
        mask = torch.ones(N, T, dtype=torch.bool)
        credit = exact_token_credit(values.expand(N, T, V), p.expand(N, T, V), ids, mask)
        permuted = permute_within_rows(credit, mask, gen)
        corr_good.append(within_response_corr(credit, credit, mask))
        corr_bad.append(within_response_corr(permuted, credit, mask))
        for adv, out in ((credit, cos_good), (permuted, cos_bad)):
            logp = torch.log_softmax(theta, dim=1).gather(1, ids.T).T  # (N, T)
            out.append(cosine(flat_policy_gradient(logp, adv, mask, [theta]), exact))
    assert sum(corr_good) / 20 == pytest.approx(1.0)
    assert abs(sum(corr_bad) / 20) < 0.1
    # permuted credit keeps 1/T of the signal in expectation: its batch gradient is noisier
    assert sum(cos_good) / 20 > 0.9
    assert sum(cos_bad) / 20 < sum(cos_good) / 20 - 0.3
