"""The ablation's training loop: ``GRPORecipe.run`` plus extra measurements at evaluations.

``train_with_evals(recipe, at_eval)`` runs the same loop as ``GRPORecipe.run`` (held-out
evaluation at step 0 and whenever ``eval.interval`` is due, checkpoints when due, a metrics
record per step) through the recipe's public API (``train_step``, ``evaluate``, ``save``,
``logger``), and merges ``at_eval()`` into every evaluation record.
``ablation_evals`` is what the runner measures there: the setting's exact held-out scores
(``probes.extra_eval``, as ``extra/<name>_<mode>``) and the credit probes
(``credit_probes.probe``, as ``probe/...``), with the credits of ``probes.compare``
(``compare_credits``) judged on the same batches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ablations import credit_probes, probes
from ablations.ablation_config import StrategyConfig
from ablations.credit_probes import CompareCredit, ProbeConfig
from ablations.settings import SettingAssets
from adapters.grad_path import with_grad_path, without_grad_path
from backends.torch.rollout_rewards import RolloutRewards
from backends.torch.trainer import GRPORecipe
from credit_core import get_strategy

EXTRA_PREFIX = "extra/"


def _due(step: int, interval: int, last: int) -> bool:
    return interval > 0 and (step % interval == 0 or step == last)


def train_with_evals(
    recipe: GRPORecipe, at_eval: Callable[[], dict[str, float]]
) -> list[dict[str, Any]]:
    """Train ``recipe`` to ``cfg.steps``; returns the metric history (one record per step)."""
    cfg = recipe.cfg
    logger = recipe.logger
    try:
        if recipe.step == 0 and cfg.eval.interval > 0:
            logger.log(0, {**recipe.evaluate(), **at_eval()})
        while recipe.step < cfg.steps:
            metrics = recipe.train_step()
            if _due(recipe.step, cfg.eval.interval, cfg.steps):
                metrics.update(recipe.evaluate())
                metrics.update(at_eval())
            logger.log(recipe.step, metrics)
            if _due(recipe.step, cfg.checkpoint.interval, cfg.steps):
                recipe.save()
            logger.advance()
    finally:
        logger.close()
    return logger.history


def compare_credits(
    recipe: GRPORecipe, strategies: Sequence[StrategyConfig]
) -> list[CompareCredit]:
    """The credits of ``strategies`` for ``recipe``'s batches: each strategy with the
    recipe's reward side (without the run strategy's path gradient), its direction gradient
    taken where it reads it (``reward_grad_points``)."""
    plain = without_grad_path(recipe.reward.signals)
    out = []
    for st in strategies:
        strategy = get_strategy(st.credit)
        signals = plain
        if strategy.reward_grad_points:
            temperature = recipe.cfg.rollout.temperature
            points = strategy.reward_grad_points
            signals = with_grad_path(plain, recipe.policy.model, points, temperature)
        out.append(CompareCredit(st.label, strategy, RolloutRewards(signals)))
    return out


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
