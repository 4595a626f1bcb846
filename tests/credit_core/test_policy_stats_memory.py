"""``policy_stats`` never materializes (B, T, V): its peak-RSS growth is a fraction of it.

Measured in a fresh process at B=2, T=1024, H=64, V=32768, d=64, where the full float32
logits would take B*T*V*4 = 256 MiB. The growth must stay under a quarter of that. Growth
is measured (``tests.helpers.peak_rss``, a fresh small process) from the current RSS after
the inputs exist and a small warm-up call has loaded the kernels, to the peak after the
full call. The same is measured for the naive dense computation, for scale.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.peak_rss import measure

B, T, H, V, D = 2, 1024, 64, 32768, 64
DENSE_BYTES = B * T * V * 4

BODY = f"""
    from credit_core import policy_stats

    torch.manual_seed(0)
    hidden = torch.randn({B}, {T}, {H})
    weight = torch.randn({V}, {H}) / 8
    table = torch.randn({V}, {D})
    ids = torch.randint(0, {V}, ({B}, {T}))
    policy_stats(hidden[:, :4], weight, ids[:, :4], table)  # warm-up: kernels, allocator

    before = current_rss()
    stats = policy_stats(hidden, weight, ids, table)
    streamed = peak_rss() - before
    assert bool(torch.isfinite(stats.m2).all())

    before = current_rss()
    p = torch.softmax(hidden @ weight.T, dim=-1)
    dense_m1, dense_m2 = p @ table, (p * p) @ table
    naive = peak_rss() - before
    err = float((dense_m1 - stats.m1).abs().max())
    del p
    report(streamed=streamed, naive=naive, m1_err=err)
    """


@pytest.mark.slow
def test_policy_stats_peak_rss_is_a_fraction_of_dense_logits() -> None:
    figures = measure(BODY)
    mib = 2**20
    print(
        f"\npolicy_stats B={B} T={T} H={H} V={V} d={D}: peak RSS +{figures['streamed'] / mib:.1f}"
        f" MiB streamed, +{figures['naive'] / mib:.1f} MiB naive dense softmax;"
        f" dense logits would be {DENSE_BYTES / mib:.0f} MiB"
    )
    assert figures["m1_err"] < 1e-4
    assert figures["naive"] > DENSE_BYTES  # the measurement sees a dense (B, T, V) tensor
    assert figures["streamed"] < DENSE_BYTES / 4


def test_a_head_in_another_dtype_is_cast_one_tile_at_a_time() -> None:
    """fp32 LM head, bf16 hidden states: ``policy_stats`` and ``unsigned_work`` make no
    (V, H) copy of the head (1-2 GB per call at a 150k x 3584 head)."""
    from credit_core import policy_stats, unsigned_work
    from tests.helpers.op_recorder import OpRecorder

    V, H, d = 40, 8, 3
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 3, H, generator=g).bfloat16()
    weight = torch.randn(V, H, generator=g)
    E = torch.randn(V, d, generator=g)
    ids = torch.randint(0, V, (2, 3), generator=g)
    grad = torch.randn(2, 3, d, generator=g)
    with OpRecorder() as ops:
        policy_stats(hidden, weight, ids, E, chunk_size=16)
        unsigned_work(hidden, weight, ids, E, grad, chunk_size=16)
    assert ops.shapes_of("to") and (V, H) not in ops.shapes_of("to")
