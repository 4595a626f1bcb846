"""What the ablation measures at each evaluation of ``GRPORecipe.run(at_eval)``.

``ablation_evals`` is what the runner merges into every evaluation record: the setting's
exact held-out scores (``probes.extra_eval``, as ``extra/<name>_<mode>``) and the credit probes
(``credit_probes.probe``, as ``probe/...``), with the credits of ``probes.compare``
(``compare_credits``) judged on the same batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ablations import credit_probes, probes
from ablations.ablation_config import StrategyConfig
from ablations.credit_probes import ProbeConfig
from ablations.settings import SettingAssets
from backends.torch.compare import CompareCredit, compare_credit
from backends.torch.trainer import GRPORecipe

EXTRA_PREFIX = "extra/"


def compare_credits(
    recipe: GRPORecipe, strategies: Sequence[StrategyConfig]
) -> list[CompareCredit]:
    """The credits of ``strategies`` for ``recipe``'s batches: each strategy with the
    recipe's reward side (without the run strategy's path gradient), its direction gradient
    taken where it reads it (``reward_grad_points``)."""
    return [compare_credit(st.label, st.credit, recipe.reward) for st in strategies]


def ablation_evals(
    recipe: GRPORecipe,
    assets: SettingAssets,
    cfg: ProbeConfig,
    compare: Sequence[CompareCredit] = (),
) -> dict[str, float]:
    """Exact held-out scores and, if enabled, the credit probes at the current policy."""
    out = {EXTRA_PREFIX + k: v for k, v in probes.extra_eval(recipe, assets.extra_eval).items()}
    if cfg.enabled:
        metric = next(iter(assets.extra_eval.values()), None)
        out.update(credit_probes.probe(recipe, cfg, assets.token_rule, metric, compare).metrics())
    return out


def final_extra(history: list[dict[str, Any]]) -> dict[str, float]:
    """The exact held-out scores of the last record that has them (``extra_eval`` names)."""
    for record in reversed(history):
        found = {
            k.removeprefix(EXTRA_PREFIX): float(v)
            for k, v in record.items()
            if k.startswith(EXTRA_PREFIX)
        }
        if found:
            return found
    return {}
