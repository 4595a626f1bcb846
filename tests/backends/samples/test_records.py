"""Which responses a step's credit samples show (``pick_rows``, shared by the trainers)."""

from __future__ import annotations

import torch

from backends.samples.records import pick_rows


def test_rows_are_both_signs_of_the_first_groups_with_an_advantage() -> None:
    adv = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.5, -1.0, 1.5, -0.5, 2.0, -2.0, 0.0, 0.0])
    assert pick_rows(adv, 4, 3) == [6, 4, 5]  # the flat first group is skipped
    assert pick_rows(adv, 4, 6) == [6, 4, 7, 5, 8, 9]  # then the next group
    assert pick_rows(adv, 4, 20) == [6, 4, 7, 5, 8, 10, 11, 9, 0, 1, 2, 3]  # all there is
    assert pick_rows(adv, 12, 2) == [8, 9]  # one group: the highest and the lowest A
