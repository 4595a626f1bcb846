"""verl's start-up refusal of a strategy only the native trainer serves (``oar_g``): checked
on the credit keys alone (``backends.verl.config`` imports no verl, so this runs anywhere)."""

from __future__ import annotations

import pytest

from backends.verl.config import credit_settings
from credit_core import CreditError


@pytest.mark.parametrize("credit", ["oar_g", {"name": "oar_g", "beta": 2.0}])
def test_oar_g_is_refused_at_start_up_naming_its_signal_and_the_answer_span(
    credit: object,
) -> None:
    config = {"algorithm": {"adv_estimator": "grpo", "credit": credit}}
    with pytest.raises(CreditError) as info:
        credit_settings(config)
    text = str(info.value)
    assert text.startswith(
        "algorithm.credit: strategy 'oar_g' is not served: it reads ['answer_saliency'] and "
        "each response's answer span (CreditBatch.answer_mask)"
    )
    assert "which the verl backend does not provide" in text


def test_a_served_strategy_still_passes() -> None:
    settings = credit_settings({"algorithm": {"adv_estimator": "grpo", "credit": "entropy_top"}})
    assert settings.plan.signals == {"token_entropy"}
