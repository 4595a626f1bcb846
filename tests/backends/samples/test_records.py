"""Which responses a step's credit samples show (``pick_rows``, shared by the trainers) and
the direction model's agreement a record carries (``StepAgreement``)."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from backends.common.credit import AgreementMetrics
from backends.samples.records import StepAgreement, pick_rows


def test_rows_are_both_signs_of_the_first_groups_with_an_advantage() -> None:
    adv = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.5, -1.0, 1.5, -0.5, 2.0, -2.0, 0.0, 0.0])
    assert pick_rows(adv, 4, 3) == [6, 4, 5]  # the flat first group is skipped
    assert pick_rows(adv, 4, 6) == [6, 4, 7, 5, 8, 9]  # then the next group
    assert pick_rows(adv, 4, 20) == [6, 4, 7, 5, 8, 10, 11, 9, 0, 1, 2, 3]  # all there is
    assert pick_rows(adv, 12, 2) == [8, 9]  # one group: the highest and the lowest A


def test_a_step_s_agreement_is_recorded_and_described_for_a_reader() -> None:
    gated = StepAgreement.of(
        AgreementMetrics(False, value=0.41234567, groups=3, skipped=1, ema=0.38, alpha=0.45)
    )
    assert (gated.agreement, gated.groups, gated.skipped, gated.ema, gated.alpha) == (
        0.412346,
        3,
        1,
        0.38,
        0.45,
    )
    assert gated.describe() == (
        "direction model vs reward: rho = 0.412 over 3 groups (1 skipped: constant reward); "
        "gate EMA 0.380, alpha 0.450"
    )
    none_yet = StepAgreement.of(AgreementMetrics(False, value=math.nan, skipped=2, alpha=0.0))
    assert none_yet.agreement is None and none_yet.ema is None
    assert none_yet.describe() == (
        "direction model vs reward: no group with varying reward (2 skipped); "
        "gate EMA none yet, alpha 0.000"
    )
    assert StepAgreement.of(AgreementMetrics(True)).describe() == (
        "the direction model is the reward (agreement 1 by construction)"
    )
    with pytest.raises(ValidationError, match="alpha"):
        StepAgreement(direction_is_reward=False, alpha=1.5)
