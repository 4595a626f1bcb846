"""fold_tiles: the scratch half of the tile buffer serves one reduction per pass."""

from __future__ import annotations

import pytest
import torch

from credit_core.logits_tiles import fold_tiles, materialized_logits
from credit_core.tile_reductions import Entropy


def test_two_scratch_reductions_in_one_pass_are_refused() -> None:
    logits = materialized_logits(torch.randn(1, 2, 5), 1.0)
    reductions = (
        Entropy(2, torch.float32, logits.device),
        Entropy(2, torch.float32, logits.device),
    )
    with pytest.raises(ValueError, match="at most one reduction per pass"):
        fold_tiles(logits, reductions, 4, 8, torch.float32)
