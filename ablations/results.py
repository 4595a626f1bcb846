"""Runs of an ablation: their identity, their stored result, and results.csv.

A run is one (setting, family, strategy label, seed). Its folder
``<output>/runs/<setting>/<family>/<strategy>/seed<k>/`` holds the trainer's run folder
(``train/``) and ``result.json``, written atomically when the run has finished. The result
records the run's ``fingerprint``, a hash of everything in the config that determines the
run; a run is done exactly when its ``result.json`` exists with the current fingerprint
(so a changed config redoes the runs it changes), which is what makes the runner
resumable and shards mergeable (``merge`` copies the current results of shard folders).

``results.csv`` has one row per run and logged step (step 0 is the held-out evaluation of
the initial policy), columns ``KEY_COLUMNS + METRIC_COLUMNS`` and then any extra metrics
(``extra_<name>_sampled`` / ``_greedy`` at every evaluation; in older results at the last
step only; the credit probes ``probe_<name>`` at every evaluation, absent from older
results). Run-level figures
(``wall_s``, ``peak_rss_mb``) and the code version that trained the run (``commit``,
``ablations.provenance``; ``unknown`` in rows written before the column) repeat on every
row of their run. Absent values are empty;
floats keep ``SIGNIFICANT`` digits, and the report is computed from the file as written, so
it can be recomputed from results.csv alone.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ablations.provenance import COMMIT_COLUMN, UNKNOWN, result_version

RESULT_FILE = "result.json"
#: Significant digits of the floats in results.csv (the report is computed from the file).
SIGNIFICANT = 7
RUNS_DIR = "runs"

KEY_COLUMNS: tuple[str, ...] = ("setting", "family", "strategy", "seed", "step")

#: results.csv column -> trainer metric name.
TRAINER_METRICS: dict[str, str] = {
    "reward_mean": "reward/mean",
    "reward_std": "reward/std",
    "eval_reward_sampled": "eval/reward_sampled",
    "eval_reward_greedy": "eval/reward_greedy",
    "response_length": "response/length_mean",
    "entropy": "policy/entropy",
    "clip_frac": "ppo/clip_frac",
    "credit_weight_max": "credit/weight_max",
    "credit_weight_entropy": "credit/weight_entropy",
    "credit_direction_agreement": "credit/direction_agreement",
    "credit_attribution_agreement": "credit/attribution_agreement",
    "credit_gate_alpha": "credit/gate_alpha",
    "time_step": "time/step",
    "time_rollout": "time/rollout",
    "time_signals": "time/signals",
    "time_signals_reward": "time/signals_reward",
    "time_update": "time/update",
}
RUN_COLUMNS: tuple[str, ...] = ("wall_s", "peak_rss_mb")
#: The columns that are measurements of time or memory (not results a rerun must repeat).
TIMING_COLUMNS: frozenset[str] = frozenset(
    {*(c for c in TRAINER_METRICS if c.startswith("time_")), *RUN_COLUMNS}
)
#: History metrics ``<prefix>/<name>`` copied as columns ``<prefix>_<name>``: the exact
#: held-out scores and the credit probes measured at evaluations (``ablations.driver``).
EVAL_PREFIXES: frozenset[str] = frozenset({"extra", "probe"})
METRIC_COLUMNS: tuple[str, ...] = (*TRAINER_METRICS, *RUN_COLUMNS)


@dataclass(frozen=True, order=True)
class RunKey:
    """The identity of one run."""

    setting: str
    family: str
    strategy: str
    seed: int

    @property
    def relpath(self) -> str:
        return f"{self.setting}/{self.family}/{self.strategy}/seed{self.seed}"

    def folder(self, output_dir: str | Path) -> Path:
        return Path(output_dir) / RUNS_DIR / self.relpath


def shard_runs(plan: Sequence[RunKey], index: int, count: int) -> list[RunKey]:
    """Runs ``index``, ``index + count``, ... of ``plan`` (round robin, so every shard gets
    a share of every setting)."""
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"--shard: expected i/n with 0 <= i < n, got {index}/{count}")
    return [run for i, run in enumerate(plan) if i % count == index]


def parse_shard(text: str) -> tuple[int, int]:
    """``"1/4"`` -> (1, 4)."""
    head, sep, tail = text.partition("/")
    try:
        index, count = int(head), int(tail)
    except ValueError:
        index, count = -1, 0
    if not sep or count < 1 or not 0 <= index < count:
        raise ValueError(f"--shard: expected i/n with 0 <= i < n (e.g. 0/2), got {text!r}")
    return index, count


def write_result(folder: Path, result: dict[str, Any]) -> None:
    """Write ``result.json`` atomically (temporary file, then rename)."""
    tmp = folder / (RESULT_FILE + ".tmp")
    tmp.write_text(json.dumps(result, indent=1, allow_nan=True))
    os.replace(tmp, folder / RESULT_FILE)


def read_result(folder: Path, fingerprint: str | None = None) -> dict[str, Any] | None:
    """The run's stored result, or None when there is none (or, with ``fingerprint``, when
    it was made with another config: its ``fingerprint`` differs)."""
    file = folder / RESULT_FILE
    if not file.is_file():
        return None
    data: dict[str, Any] = json.loads(file.read_text())
    if fingerprint is not None and data.get("fingerprint") != fingerprint:
        return None
    return data


def collect(
    plan: Sequence[RunKey], output: Path, fingerprints: Mapping[RunKey, str]
) -> tuple[dict[RunKey, dict[str, Any]], list[RunKey]]:
    """Results of ``plan`` made with the current config (``fingerprints``) in the output
    folder ``output``, and the runs that have none."""
    found: dict[RunKey, dict[str, Any]] = {}
    missing = []
    for run in plan:
        result = read_result(run.folder(output), fingerprints[run])
        if result is None:
            missing.append(run)
        else:
            found[run] = result
    return found, missing


def result_rows(run: RunKey, result: dict[str, Any]) -> list[dict[str, Any]]:
    """The results.csv rows of one run (one per logged step)."""
    history: list[dict[str, Any]] = result["history"]
    last = max((int(r["step"]) for r in history), default=0)
    rows = []
    for record in sorted(history, key=lambda r: int(r["step"])):
        step = int(record["step"])
        row: dict[str, Any] = {**asdict(run), "step": step}
        for column, name in TRAINER_METRICS.items():
            if name in record:
                row[column] = record[name]
        for name, value in record.items():
            head, sep, tail = name.partition("/")
            if sep and head in EVAL_PREFIXES:
                row[f"{head}_{tail}"] = value
        for column in RUN_COLUMNS:
            row[column] = result.get(column)
        row[COMMIT_COLUMN] = result_version(result).label
        if step == last:
            row.update({f"extra_{k}": v for k, v in result.get("extra", {}).items()})
        rows.append(row)
    return rows


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.{SIGNIFICANT}g}"
    return str(value)


def write_csv(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    """Write rows with the fixed columns first and extra columns (sorted) after them."""
    rows = list(rows)
    fixed = [*KEY_COLUMNS, COMMIT_COLUMN, *METRIC_COLUMNS]
    extra = sorted({k for r in rows for k in r} - set(fixed))
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow([*fixed, *extra])
        for row in rows:
            writer.writerow([_cell(row.get(c)) for c in (*fixed, *extra)])
    os.replace(tmp, path)


def read_csv(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a results.csv: keys typed (seed, step int), metrics float, empty -> absent;
    ``commit`` a string, ``unknown`` where the file has no such column or cell."""
    rows = []
    with open(path, newline="", encoding="utf-8") as fh:
        for raw in csv.DictReader(fh):
            row: dict[str, Any] = {}
            for key, value in raw.items():
                if value in ("", None):
                    continue
                if key in ("seed", "step"):
                    row[key] = int(value)
                elif key in ("setting", "family", "strategy", COMMIT_COLUMN):
                    row[key] = value
                else:
                    row[key] = float(value)
            row.setdefault(COMMIT_COLUMN, UNKNOWN)
            rows.append(row)
    return rows


def build_text(info: Mapping[str, Any]) -> str:
    """The build of a run's models as its result records it: the assets' ``info`` (the
    pretraining's and the reward model's own losses and fits, to full float precision),
    canonical JSON. Two builds of the same spec on other machines or code versions can
    differ (float rounding compounds through training); runs compared as a pair must share
    one build."""
    return json.dumps(info, sort_keys=True, default=str)
