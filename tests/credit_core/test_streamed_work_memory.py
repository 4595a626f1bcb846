"""``streamed_unsigned_work`` never materializes (B, T, V): its peak-RSS growth is a fraction
of it, and within twice its one working buffer.

Measured in a fresh process at B=2, T=1024, H=64, V=32768, d=64, where the full float32
logits would take B*T*V*4 = 256 MiB. The growth must stay under a quarter of that, and under
twice the kernel's working buffer (e stacked on u: 2 x DEFAULT_TILE_ELEMENTS float32),
measured as in ``test_policy_stats_memory.py`` (``tests.helpers.peak_rss``).
"""

from __future__ import annotations

import pytest

from credit_core.policy_stats import DEFAULT_TILE_ELEMENTS
from tests.helpers.peak_rss import measure

B, T, H, V, D = 2, 1024, 64, 32768, 64
DENSE_BYTES = B * T * V * 4
BUFFER_BYTES = 2 * DEFAULT_TILE_ELEMENTS * 4

BODY = f"""
    from credit_core import streamed_unsigned_work

    torch.manual_seed(0)
    hidden = torch.randn({B}, {T}, {H})
    weight = torch.randn({V}, {H}) / 8
    table = torch.randn({V}, {D})
    ids = torch.randint(0, {V}, ({B}, {T}))
    grad = torch.randn({B}, {T}, {D})
    streamed_unsigned_work(hidden[:, :4], weight, ids[:, :4], table, grad[:, :4])  # warm-up

    before = current_rss()
    w0 = streamed_unsigned_work(hidden, weight, ids, table, grad)
    streamed = peak_rss() - before
    assert bool(torch.isfinite(w0).all())

    before = current_rss()
    p = torch.softmax(hidden @ weight.T, dim=-1)
    u = grad @ table.T
    ubar = (p * u).sum(-1)
    at_y = ids.unsqueeze(-1)
    dense = p.gather(-1, at_y).squeeze(-1) * (u.gather(-1, at_y).squeeze(-1) - ubar)
    dense = dense - ((p * p * u).sum(-1) - ubar * (p * p).sum(-1))
    naive = peak_rss() - before
    err = float((dense - w0).abs().max() / dense.abs().max())
    del p, u
    report(streamed=streamed, naive=naive, w0_err=err)
    """


@pytest.mark.slow
def test_streamed_work_peak_rss_is_a_fraction_of_dense_logits() -> None:
    figures = measure(BODY)
    mib = 2**20
    print(
        f"\nstreamed_unsigned_work B={B} T={T} H={H} V={V} d={D}: "
        f"peak RSS +{figures['streamed'] / mib:.1f}"
        f" MiB streamed, +{figures['naive'] / mib:.1f} MiB naive dense;"
        f" dense logits would be {DENSE_BYTES / mib:.0f} MiB"
    )
    assert figures["w0_err"] < 1e-4
    assert figures["naive"] > DENSE_BYTES  # the measurement sees a dense (B, T, V) tensor
    assert figures["streamed"] < DENSE_BYTES / 4
    assert figures["streamed"] < 2 * BUFFER_BYTES
