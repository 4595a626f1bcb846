"""The report's number formats (``ablations.summary``)."""

from __future__ import annotations

import pytest

from ablations.summary import fmt_p


@pytest.mark.parametrize(
    ("p", "text"),
    [
        (0.036, "p = 0.036"),
        (1.0, "p = 1.000"),
        (0.0005, "p = 0.001"),  # rounds to three decimals
        (0.0004999, "p < 0.001"),  # too small to write with three decimals: never "p = 0.000"
        (0.0, "p < 0.001"),
        (float("nan"), "p = n/a"),  # no verdict
    ],
)
def test_a_p_value_reads_with_three_decimals_or_as_below_one_thousandth(
    p: float, text: str
) -> None:
    assert fmt_p(p) == text
