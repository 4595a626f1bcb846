"""Rerun a sample of recorded runs and compare their final metrics: may they be carried over?

``check_sample(cfg, sample=n, seed=s, tolerance=t)`` draws ``n`` runs at random (seeded)
from the recorded runs of ``cfg``: those whose ``result.json`` in ``cfg.output_dir`` holds
the current fingerprint, or, with ``rows``, the planned runs that those results.csv files
hold (the rows ``merge --rows`` would carry over). Each is trained again from scratch
(``runner.execute_run``, same config and so same fingerprint) into a temporary folder, and
its final metrics (``final_metrics``: the figures the report's verdicts are drawn from) are
compared with the recorded ones. Both sides are compared as results.csv writes them
(``SIGNIFICANT`` digits, written and read back), so a tolerance of 0 asks for the same
file cells; a metric present on one side only, or NaN on one side only, differs.
"""

from __future__ import annotations

import math
import random
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ablations.ablation_config import AblateConfig
from ablations.provenance import CodeVersion, code_version, row_version
from ablations.results import RunKey, collect, read_csv, result_rows, write_csv
from ablations.runner import AssetKey, asset_key, build_assets, execute_run, fingerprints, plan_runs
from ablations.settings import SettingAssets
from ablations.summary import group_runs, last_value, run_figures
from backends.common.errors import ConfigError

#: The final train reward's name among ``final_metrics`` (not a results.csv column).
FINAL_TRAIN = "final_train_reward"


@dataclass(frozen=True)
class Comparison:
    """One rerun against its record: the recorded and rerun final metrics, the versions
    that produced them, and the metrics whose absolute difference exceeds the tolerance
    (inf: present or finite on one side only)."""

    run: RunKey
    recorded_by: CodeVersion
    rerun_by: CodeVersion
    recorded: dict[str, float]
    rerun: dict[str, float]
    differences: dict[str, float]

    @property
    def identical(self) -> bool:
        return not self.differences

    @property
    def line(self) -> str:
        """The one line the check prints for this run."""
        who = f"(recorded by {self.recorded_by.short}, rerun by {self.rerun_by.short})"
        if self.identical:
            return f"identical {self.run.relpath} {who}"
        parts = ", ".join(
            f"{name} {self.recorded.get(name, math.nan):.7g} -> "
            f"{self.rerun.get(name, math.nan):.7g}"
            for name in self.differences
        )
        return f"differs by {max(self.differences.values()):.3g} {self.run.relpath} {who}: {parts}"


def final_metrics(rows: Sequence[dict[str, Any]], final_window: int) -> dict[str, float]:
    """The figures of one run's results.csv rows that the report draws verdicts from: the
    final train reward (mean ``reward_mean`` of the last ``final_window`` steps), the last
    held-out ``eval_reward_sampled`` / ``eval_reward_greedy``, and every ``extra_*``
    column at the last step that has it."""
    figures = run_figures(rows, "eval_reward_sampled", final_window)
    metrics = {
        FINAL_TRAIN: figures.final_train,
        "eval_reward_sampled": figures.held_sampled,
        "eval_reward_greedy": figures.held_greedy,
    }
    extras = sorted({k for r in rows for k in r if k.startswith("extra_")})
    return metrics | {column: last_value(rows, column) for column in extras}


def differences(
    recorded: dict[str, float], rerun: dict[str, float], tolerance: float
) -> dict[str, float]:
    """metric -> absolute difference, for the metrics that differ by more than
    ``tolerance`` (NaN on both sides is equal; on one side, or absent on one, is inf)."""
    out: dict[str, float] = {}
    for name in sorted(recorded.keys() | rerun.keys()):
        a, b = recorded.get(name, math.nan), rerun.get(name, math.nan)
        if math.isnan(a) and math.isnan(b) and name in recorded and name in rerun:
            continue
        gap = abs(a - b) if not (math.isnan(a) or math.isnan(b)) else math.inf
        if gap > tolerance:
            out[name] = gap
    return out


def _written(run: RunKey, result: dict[str, Any], folder: Path) -> list[dict[str, Any]]:
    """A result's rows as results.csv writes and reads them (rounded as the file is)."""
    path = folder / "rows.csv"
    write_csv(path, result_rows(run, result))
    return read_csv(path)


def recorded_runs(
    cfg: AblateConfig, rows: Sequence[Path], folder: Path
) -> dict[RunKey, list[dict[str, Any]]]:
    """The recorded rows of each planned run: from the ``rows`` results.csv files when
    given, else from the current results in ``cfg.output_dir`` (written out in ``folder``)."""
    plan = plan_runs(cfg)
    if rows:
        written = group_runs(row for path in rows for row in read_csv(path))
        return {run: written[run] for run in plan if run in written}
    found, _ = collect(plan, Path(cfg.output_dir), fingerprints(cfg, plan))
    return {run: _written(run, result, folder) for run, result in found.items()}


def check_sample(
    cfg: AblateConfig,
    *,
    sample: int,
    seed: int = 0,
    tolerance: float = 0.0,
    rows: Sequence[Path] = (),
    log: Callable[[str], None] = print,
) -> list[Comparison]:
    """Rerun ``sample`` recorded runs drawn with ``seed`` and compare each (see the module
    docstring); logs one line per run as it is done. Raises ``ConfigError`` when
    ``sample`` or ``tolerance`` is out of range or there are fewer recorded runs."""
    if sample < 1:
        raise ConfigError(f"--sample: expected at least 1 run, got {sample}")
    if not tolerance >= 0:
        raise ConfigError(f"--tolerance: expected a number >= 0, got {tolerance}")
    torch.set_num_threads(cfg.threads)
    with tempfile.TemporaryDirectory(prefix="ablate-check-") as tmp:
        folder = Path(tmp)
        recorded = recorded_runs(cfg, rows, folder)
        where = ", ".join(map(str, rows)) if rows else f"{cfg.output_dir} (this config's results)"
        if len(recorded) < sample:
            raise ConfigError(
                f"--sample {sample}: only {len(recorded)} recorded runs of this config in {where}"
            )
        chosen = sorted(random.Random(seed).sample(sorted(recorded), sample))
        log(f"[check] rerunning {sample} of {len(recorded)} recorded runs from {where}")
        assets: dict[AssetKey, SettingAssets] = {}
        comparisons = []
        for run in chosen:
            key = asset_key(cfg, run)
            if key not in assets:
                assets[key] = build_assets(cfg, key, lambda m: None)
            result = execute_run(cfg, run, assets[key], folder / "runs", heatmap=False)
            window = cfg.report.final_window
            before = final_metrics(recorded[run], window)
            after = final_metrics(_written(run, result, folder), window)
            comparison = Comparison(
                run=run,
                recorded_by=row_version(recorded[run][0]),
                rerun_by=code_version(),
                recorded=before,
                rerun=after,
                differences=differences(before, after, tolerance),
            )
            log(comparison.line)
            comparisons.append(comparison)
    same = sum(c.identical for c in comparisons)
    log(
        f"[check] {same} of {len(comparisons)} rerun runs identical to their record "
        f"(tolerance {tolerance:g}); {len(comparisons) - same} differ"
    )
    return comparisons
