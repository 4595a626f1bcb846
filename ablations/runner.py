"""Running an ablation: plan, build the settings' assets, train every run, write the outputs.

``run_ablation(cfg, shard_index=i, shard_count=n)`` trains this shard's share of the plan,
one run after the other in this process, skipping every run whose ``result.json`` exists
(resume); with the whole plan (``n == 1``) it then writes results.csv, report.md and the
figures and returns their paths (a shard returns None). ``merge`` copies the results of
shards (from their output folders) into one output folder and writes the same outputs.

A run trains with the torch backend's ``GRPORecipe`` (``backends.torch.trainer``), with the
trainer config built by ``run_train_config``, through ``GRPORecipe.run(at_eval)``: at every
evaluation the exact held-out scores of the setting (``probes.extra_eval``) and the credit
probes (``credit_probes``) join the trainer's own held-out metrics. Afterwards, for the
method's first family and seed, the credit heat-map data (``probes.credit_examples``) are
computed from the final policy in memory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from ablations import figures as figs
from ablations.ablation_config import AblateConfig, deep_merge
from ablations.agreement_gain import MEASURES, agreement_gains, agreement_markdown
from ablations.bank import deposit, withdraw
from ablations.contrasts import judge
from ablations.gate_criteria import gate_criteria, gate_criteria_markdown
from ablations.head_to_head import (
    STRONGEST_FILE,
    head_to_head,
    head_to_head_markdown,
    read_strongest,
    strongest_baselines,
)
from ablations.pretrain import TOKENIZER_DIR
from ablations.primary import primary_family, primary_markdown
from ablations.provenance import code_version, provenance_markdown
from ablations.report import render_report
from ablations.results import (
    RESULT_FILE,
    RunKey,
    build_text,
    collect,
    read_csv,
    read_result,
    result_rows,
    shard_runs,
    write_csv,
    write_result,
)
from ablations.sample_fidelity import SettingFidelity, fidelity_markdown, setting_fidelity
from ablations.settings import SettingAssets
from ablations.summary import SettingSpec, SummarySpec, group_runs, summarize
from ablations.supervision import WORKERS_DIR, RunStoppedError, set_status, supervise
from ablations.sweeps import Sweep, find_sweeps, measured_sweep, sweep_markdown, sweep_table
from adapters.folder_cache import spec_hash
from backends.common.errors import ConfigError

#: Bumped when what a run computes changes, so that older results are redone.
RESULT_VERSION = 2
REPORT_FILE = "report.md"
CSV_FILE = "results.csv"
FIGURES_DIR = "figures"
TRAIN_DIR = "train"

Log = Callable[[str], None]


def plan_runs(cfg: AblateConfig) -> list[RunKey]:
    """Every run of ``cfg``, in report order: setting, family, strategy, seed (a strategy
    only in the settings it runs in)."""
    return [
        RunKey(setting, family, strategy.label, seed)
        for setting in cfg.settings
        for family in cfg.families
        for strategy in cfg.strategies
        if strategy.runs_in(setting)
        for seed in cfg.seeds
    ]


def run_train_config(
    cfg: AblateConfig, run: RunKey, assets: SettingAssets, run_dir: Path
) -> dict[str, Any]:
    """The trainer config (a mapping for ``backends.torch.config``) of one run."""
    merged = deep_merge(deep_merge(cfg.train, assets.train), cfg.settings[run.setting].train)
    merged = deep_merge(merged, cfg.strategy(run.strategy).train)
    own = {
        "seed": run.seed,
        "output_dir": str(run_dir / TRAIN_DIR),
        "credit": cfg.strategy(run.strategy).credit.model_dump(),
        "policy": {
            "path": str(assets.policy_dir),
            "tokenizer": str(assets.policy_dir / TOKENIZER_DIR),
        },
        "data": assets.data,
        "reward": assets.reward,
        "logging": {
            "progress": False,
            "tensorboard": merged.get("logging", {}).get("tensorboard", False),
        },
    }
    return deep_merge(merged, own)


class PeakRSS:
    """Samples this process's resident memory every ``interval`` s while active (MB)."""

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    @staticmethod
    def current_mb() -> float:
        try:
            with open("/proc/self/statm") as fh:
                pages = int(fh.read().split()[1])
            return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
        except (OSError, ValueError, IndexError):
            import resource

            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.current_mb())
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakRSS:
        self.peak = self.current_mb()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.current_mb())


def execute_run(
    cfg: AblateConfig, run: RunKey, assets: SettingAssets, output_dir: Path, *, heatmap: bool
) -> dict[str, Any]:
    """Train one run from scratch (a half-finished folder is cleared) and store its result,
    with the code version of this process (``provenance.code_version``)."""
    from ablations import probes
    from ablations.driver import ablation_evals, compare_credits, final_extra
    from backends.torch.trainer import GRPORecipe, resolve_config

    folder = run.folder(output_dir)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    train_cfg = resolve_config(run_train_config(cfg, run, assets, folder))
    start = time.perf_counter()
    with PeakRSS() as mem:
        recipe = GRPORecipe(train_cfg)
        try:
            if assets.prepare_policy is not None:  # the setting's cost cut: a frozen stack
                assets.prepare_policy(recipe.policy.model)
            others = [cfg.strategy(x) for x in cfg.probes.compare]
            compare = compare_credits(recipe, [o for o in others if o.runs_in(run.setting)])
            done = recipe.run(lambda: ablation_evals(recipe, assets, cfg.probes, compare))
            if done.preempted is not None:
                raise RunStoppedError(
                    f"run {run.relpath}: {done.preempted.signal} received, stopped after step "
                    f"{done.preempted.step}; it is redone from the start on the next invocation"
                )
            history = done.history
            wall = time.perf_counter() - start
            extra = final_extra(history) or probes.extra_eval(recipe, assets.extra_eval)
            credit = probes.credit_examples(recipe, cfg.report.heatmap_responses) if heatmap else []
        except RunStoppedError:
            raise
        except Exception as exc:
            raise RuntimeError(
                f"run {run.relpath} failed at step {recipe.step}: {type(exc).__name__}: {exc} "
                f"(its folder {folder} is redone on the next invocation)"
            ) from exc
        finally:
            recipe.close()
    result = {
        "fingerprint": run_fingerprint(cfg, run),
        "code": code_version().label,
        "run": {
            "setting": run.setting,
            "family": run.family,
            "strategy": run.strategy,
            "seed": run.seed,
        },
        "history": history,
        "extra": extra,
        "wall_s": wall,
        "peak_rss_mb": mem.peak,
        "threads": torch.get_num_threads(),
        "info": assets.info,
        "credit_examples": credit,
    }
    write_result(folder, result)
    return result


@dataclass(frozen=True)
class Outputs:
    report: Path
    csv: Path
    figures: list[Path]


#: Relative cost of building a setting's assets (largest first when spread over workers).
_ASSET_COST = {
    "outcome_chain": 6,
    "preference": 3,
    "minilm_shared": 4,
    "verifiable": 3,
    "keyword_sparse": 3,
    "target_tokens": 2,
    "minilm_bridge": 1,
    "positional_sparse": 1,
}


def runs_now(cfg: AblateConfig, plan: Sequence[RunKey]) -> list[RunKey]:
    """The runs of ``plan`` this invocation trains: all, or those of the strategies named by
    ``cfg.only`` (the rest is left to other invocations)."""
    return [r for r in plan if cfg.only is None or r.strategy in cfg.only]


def run_fingerprint(cfg: AblateConfig, run: RunKey) -> str:
    """A hash of everything in ``cfg`` that determines ``run``'s result: its training
    section, the setting's kind (where given) and parameters, the strategy's credit config
    (and its own trainer overrides, where it has them), the probes, family and seed."""
    strategy = cfg.strategy(run.strategy)
    spec = {
        "version": RESULT_VERSION,
        "run": [run.setting, run.family, run.seed],
        "credit": strategy.credit.model_dump(mode="json"),
        "train": deep_merge(cfg.train, cfg.settings[run.setting].train),
        "params": cfg.setting_params(run.setting, run.seed).model_dump(mode="json"),
        "probes": cfg.probes.model_dump(mode="json"),
    }
    # Only where given: the fingerprints of settings and rows without them stay as they were.
    kind = cfg.settings[run.setting].kind
    if kind is not None:
        spec["kind"] = kind
    if strategy.train:
        spec["strategy_train"] = strategy.train
    return spec_hash(spec)


def fingerprints(cfg: AblateConfig, runs: Sequence[RunKey]) -> dict[RunKey, str]:
    return {r: run_fingerprint(cfg, r) for r in runs}


def withdraw_banked(cfg: AblateConfig, log: Log) -> None:
    """Take the runs of ``cfg.banked`` made with this config into the output folder
    (``ablations.bank.withdraw``), saying how many."""
    if not cfg.banked:
        return
    prints = fingerprints(cfg, plan_runs(cfg))
    try:
        n = withdraw([Path(f) for f in cfg.banked], Path(cfg.output_dir), prints)
    except (OSError, ValueError) as err:
        raise ConfigError(f"banked: {err}") from err
    if n:
        log(f"[ablate] {n} finished runs taken from the banks {', '.join(cfg.banked)}")


def deposit_banked(cfg: AblateConfig) -> tuple[Path | None, int, int]:
    """Add the output folder's finished runs of this config to the first of ``cfg.banked``
    (``ablations.bank.deposit``): (the new bank file or None, runs finished in the output
    folder, runs planned). ``ConfigError`` without a bank."""
    if not cfg.banked:
        raise ConfigError("banked: the config names no bank folder to add the finished runs to")
    plan = plan_runs(cfg)
    prints = fingerprints(cfg, plan)
    found, _ = collect(plan, Path(cfg.output_dir), prints)
    try:
        file = deposit([Path(b) for b in cfg.banked], Path(cfg.output_dir), plan, prints)
    except (OSError, ValueError) as err:
        raise ConfigError(f"banked: {err}") from err
    return file, len(found), len(plan)


def _pending(cfg: AblateConfig, runs: Sequence[RunKey]) -> list[RunKey]:
    out = Path(cfg.output_dir)
    return [r for r in runs if read_result(r.folder(out), run_fingerprint(cfg, r)) is None]


def _other_build(
    cfg: AblateConfig,
    finished: Mapping[RunKey, dict[str, Any] | None],
    key: AssetKey,
    assets: SettingAssets,
) -> list[RunKey]:
    """The runs of ``finished`` (run -> its result, None where it has none) that use
    ``key``'s models and were trained on a build of them other than ``assets``."""
    build = build_text(json.loads(build_text(assets.info)))  # as a result.json holds it
    return [
        run
        for run, result in finished.items()
        if result is not None
        and asset_key(cfg, run) == key
        and build_text(result.get("info", {})) != build
    ]


AssetKey = tuple[str, str, int | None]


def asset_key(cfg: AblateConfig, run: RunKey) -> AssetKey:
    """Which assets ``run`` uses: its setting's and family's, and with ``model_seeds`` its
    seed's (None: shared by every seed)."""
    return (run.setting, run.family, run.seed if cfg.model_seeds else None)


def mixed_builds(
    cfg: AblateConfig, found: Mapping[RunKey, dict[str, Any]]
) -> dict[AssetKey, list[list[RunKey]]]:
    """The asset keys whose finished runs in ``found`` were trained on different builds of
    their models (``build_text`` differs), with the runs of each build."""
    by_key: dict[AssetKey, dict[str, list[RunKey]]] = {}
    for run, result in found.items():
        builds = by_key.setdefault(asset_key(cfg, run), {})
        builds.setdefault(build_text(result.get("info", {})), []).append(run)
    return {key: list(b.values()) for key, b in by_key.items() if len(b) > 1}


def _mixed_line(key: AssetKey, builds: list[list[RunKey]]) -> str:
    groups = " | ".join(", ".join(r.strategy for r in runs) for runs in builds)
    return f"{'/'.join(str(k) for k in key if k is not None)} ({groups})"


def build_assets(cfg: AblateConfig, key: AssetKey, log: Log) -> SettingAssets:
    """The assets of ``key`` (setting, family, model seed or None), built or read from the
    cache. Raises ``ConfigError`` if the setting's exact scorers are not the ones its
    ``SettingKind.extra`` declares (the primary metrics a config may name)."""
    setting, family, seed = key
    start = time.perf_counter()
    kind = cfg.setting_kind(setting)
    assets = kind.build(cfg.setting_params(setting, seed), family, Path(cfg.cache_dir))
    if sorted(assets.extra_eval) != sorted(kind.extra):
        raise ConfigError(
            f"setting {setting}: its assets score {sorted(assets.extra_eval)} but its "
            f"SettingKind.extra declares {sorted(kind.extra)}"
        )
    which = f"{setting}/{family}" + ("" if seed is None else f"/seed {seed}")
    log(f"[ablate] assets of {which} ready in {time.perf_counter() - start:.1f}s")
    return assets


def reference_baselines(cfg: AblateConfig) -> dict[str, str] | None:
    """setting -> strongest baseline of ``report.reference`` (None when unset); raises
    ``ConfigError`` naming the key where the file is missing or malformed."""
    if cfg.report.reference is None:
        return None
    try:
        return read_strongest(cfg.report.reference)
    except (OSError, ValueError) as e:
        raise ConfigError(f"report.reference: {e}") from e


def run_ablation(
    cfg: AblateConfig,
    *,
    command: str,
    shard_index: int = 0,
    shard_count: int = 1,
    log: Log = print,
    assets_only: bool = False,
) -> Outputs | None:
    """Train this shard's pending runs in this process; with the whole plan, write and
    return the outputs. ``assets_only`` builds this shard's share of the assets that the
    plan's pending runs need, and nothing else (the first phase of ``run_workers``)."""
    torch.set_num_threads(cfg.threads)
    out = Path(cfg.output_dir)
    plan = plan_runs(cfg)
    reference_baselines(cfg)  # a bad reference fails now, not after the runs
    withdraw_banked(cfg, log)
    if assets_only:
        keys = sorted(
            {asset_key(cfg, r) for r in _pending(cfg, runs_now(cfg, plan))},
            key=lambda k: (-_ASSET_COST.get(k[0], 0), k[0], k[1], k[2] or 0),
        )
        for key in keys[shard_index::shard_count]:
            set_status(out, shard_index, f"assets of {'/'.join(map(str, key))}")
            build_assets(cfg, key, log)
        return None
    mine = shard_runs(runs_now(cfg, plan), shard_index, shard_count)
    finished = {r: read_result(r.folder(out), run_fingerprint(cfg, r)) for r in mine}
    pending = [r for r in mine if finished[r] is None]
    stale = sum((r.folder(out) / RESULT_FILE).is_file() for r in pending)
    log(
        f"[ablate] {len(plan)} runs planned; this shard ({shard_index}/{shard_count}) has "
        f"{len(mine)}, {len(mine) - len(pending)} already done, {len(pending)} to run"
        + (f" ({stale} of them done before with another config)" if stale else "")
    )
    assets: dict[AssetKey, SettingAssets] = {}
    method = cfg.method_label
    t0 = time.perf_counter()
    queued = set(pending)

    def assets_of(key: AssetKey) -> SettingAssets:
        """``key``'s assets, built once; the finished runs of ``key`` trained on another
        build of them join ``pending`` (a pair is compared on one build of its models)."""
        if key not in assets:
            set_status(out, shard_index, f"assets of {'/'.join(map(str, key))}")
            assets[key] = build_assets(cfg, key, log)
            rebuilt = _other_build(
                cfg, {r: f for r, f in finished.items() if r not in queued}, key, assets[key]
            )
            if rebuilt:
                log(
                    f"[ablate] {len(rebuilt)} finished runs of {'/'.join(map(str, key))} were "
                    "trained on another build of its models (their info differs from the "
                    "cache's); they are trained again: " + ", ".join(r.strategy for r in rebuilt)
                )
                pending.extend(rebuilt)  # the loop below iterates the growing list
                queued.update(rebuilt)
        return assets[key]

    for key in mixed_builds(cfg, {r: f for r, f in finished.items() if f is not None}):
        assets_of(key)  # finished runs of two builds: retrain those not of the cache's
    for i, run in enumerate(pending, start=1):
        key = asset_key(cfg, run)
        assets_of(key)
        set_status(
            out, shard_index, f"run {run.relpath}", run.folder(out) / TRAIN_DIR / "metrics.jsonl"
        )
        heatmap = (run.strategy, run.family, run.seed) == (method, cfg.families[0], cfg.seeds[0])
        result = execute_run(cfg, run, assets[key], out, heatmap=heatmap)
        final = [r for r in result["history"] if "eval/reward_sampled" in r]
        held = f"{final[-1]['eval/reward_sampled']:.3f}" if final else "n/a"
        log(
            f"[ablate] {i}/{len(pending)} {run.relpath}: held-out reward {held}, "
            f"{result['wall_s']:.1f}s (elapsed {time.perf_counter() - t0:.0f}s)"
        )
    if shard_count > 1:
        log(f"[ablate] shard {shard_index}/{shard_count} done")
        return None
    return _outputs_unless_partial(cfg, command, log)


def _outputs_unless_partial(cfg: AblateConfig, command: str, log: Log) -> Outputs | None:
    """The outputs of the whole plan, or None with ``cfg.only`` set (part of the plan)."""
    if cfg.only is not None:
        log(
            f"[ablate] the runs of {', '.join(cfg.only)} are done; the report needs the "
            "whole plan: `python -m ablations merge` the other runs (--from, --rows)"
        )
        return None
    return write_outputs(cfg, command=command)


WORKER_CONFIG = "ablate_config.yaml"


def run_workers(cfg: AblateConfig, *, command: str, log: Log = print) -> Outputs | None:
    """Run the plan with ``cfg.workers`` worker processes on this machine (each a shard,
    ``cfg.threads`` torch threads each): first the assets, spread over the workers, then the
    runs; then write the outputs. The resolved config is written to the output folder for
    the workers (``ablate_config.yaml``).

    The runner supervises its workers (``supervise``): one that dies, fails or hangs ends
    the runner (the others are stopped) with a ``WorkerFailedError`` naming it and its run; a
    stop signal is passed to every worker and ends the runner with ``RunStoppedError``. Finished
    runs are kept either way, so the same command continues. None with ``cfg.only``."""
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    withdraw_banked(cfg, log)
    cfg_file = out / WORKER_CONFIG
    cfg_file.write_text(yaml.safe_dump({**cfg.to_yaml_dict(), "workers": 1}, sort_keys=False))
    n = cfg.workers
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for phase, extra in (("assets", ["--assets-only"]), ("runs", [])):
        log(f"[ablate] {phase}: {n} worker processes")
        shutil.rmtree(out / WORKERS_DIR, ignore_errors=True)
        argv = [sys.executable, "-m", "ablations", str(cfg_file)]
        procs = [
            subprocess.Popen([*argv, "--shard", f"{i}/{n}", *extra], env=env) for i in range(n)
        ]
        supervise(procs, out, cfg.worker_timeout_s, phase)
    return _outputs_unless_partial(cfg, command, log)


def merge(
    cfg: AblateConfig, sources: Sequence[Path], *, command: str, earlier: Sequence[Path] = ()
) -> Outputs:
    """Copy every planned run's folder, made with this config, from the shard output folders
    ``sources`` into ``cfg.output_dir`` (current runs already there are kept) and write the
    outputs (``write_outputs``, with the ``earlier`` results.csv files)."""
    out = Path(cfg.output_dir)
    withdraw_banked(cfg, print)
    for run, fingerprint in fingerprints(cfg, plan_runs(cfg)).items():
        dest = run.folder(out)
        if read_result(dest, fingerprint) is not None:
            continue
        for src in sources:
            if read_result(run.folder(src), fingerprint) is not None:
                if dest.exists():
                    shutil.rmtree(dest)
                shutil.copytree(run.folder(src), dest)
                break
    return write_outputs(cfg, command=command, earlier=earlier)


def summary_spec(cfg: AblateConfig) -> SummarySpec:
    return SummarySpec(
        settings=[
            SettingSpec(
                name,
                cfg.setting_title(name),
                cfg.primary(name),
                cfg.primary_label(name),
                cfg.settings[name].threshold,
            )
            for name in cfg.settings
        ],
        strategies=[s.label for s in cfg.strategies],
        baseline=cfg.baseline,
        method=cfg.method_label,
        control=cfg.control,
        final_window=cfg.report.final_window,
        smooth=cfg.report.smooth,
        confidence=cfg.report.confidence,
        min_pairs=cfg.report.min_pairs,
        primary_family=None if (f := cfg.report.primary_family) is None else f.spec(),
    )


def config_sweeps(cfg: AblateConfig) -> list[Sweep]:
    """The sweeps among ``cfg``'s settings (``sweeps.find_sweeps``: settings of one kind whose
    params differ in one number)."""
    return find_sweeps(
        {n: (cfg.settings[n].kind or n, cfg.setting_params(n).model_dump()) for n in cfg.settings},
        {n: cfg.primary(n) for n in cfg.settings},
    )


def declared_sweeps(cfg: AblateConfig, fidelity: dict[str, SettingFidelity]) -> list[Sweep]:
    """The sweeps ``cfg`` declares (``report.sweeps``; ``sweeps.measured_sweep``), ordered by
    each setting's measured axis in ``fidelity``. ConfigError naming the sweep's key where a
    setting's runs measured none."""
    out = []
    for i, decl in enumerate(cfg.report.sweeps):
        kind = cfg.settings[decl.settings[0]].kind or decl.settings[0]
        try:
            out.append(measured_sweep(decl.name, kind, decl.settings, decl.axis, fidelity))
        except ValueError as exc:
            raise ConfigError(f"report.sweeps.{i}: {exc}") from None
    return out


#: The model fits a run's ``info`` records -> (record, the two figures, their name in the
#: report): the regression RMs of settings 1-9, the outcome classifier of ``real_lm``, the
#: preference RM of setting 8.
_FITS: tuple[tuple[str, tuple[str, str], str], ...] = (
    ("rm_fit", ("test_mse", "test_corr"), "reward model fit (held-out MSE / correlation)"),
    (
        "rm_fit",
        ("val_accuracy", "val_auc"),
        "outcome RM fit (accuracy / AUC on the training prompts kept out)",
    ),
    (
        "preference_fit",
        ("test_label_accuracy", "test_rule_accuracy"),
        "reward model fit (held-out pair accuracy: labels / hidden rule)",
    ),
)


def _fit_kind(record: str, fit: Mapping[str, Any], run: RunKey) -> tuple[str, tuple[str, str]]:
    """The report name and figure keys of ``info[record]``; an error naming the run and
    the keys where the record is of no known kind (ConfigError)."""
    for rec, keys, name in _FITS:
        if rec == record and all(k in fit for k in keys):
            return name, keys
    known = [keys for rec, keys, _ in _FITS if rec == record]
    raise ConfigError(f"{run}: info.{record} has keys {sorted(fit)}; expected one of {known}")


def _setting_info(results: dict[RunKey, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Facts about each setting's models for the report; with one model per seed
    (``model_seeds``), each figure is the mean over the distinct models with its range."""
    numbers: dict[str, dict[str, dict[tuple[float, ...], None]]] = {}  # distinct models
    info: dict[str, dict[str, Any]] = {}
    for run, result in results.items():
        facts = info.setdefault(run.setting, {})
        found = numbers.setdefault(run.setting, {})
        raw = result.get("info", {})
        pre = raw.get("pretrain")
        if pre:
            figures = (pre["first_loss"], pre["final_loss"], pre["steps"])
            found.setdefault(f"pretraining loss ({run.family})", {})[figures] = None
        for record in ("rm_fit", "preference_fit"):
            fit = raw.get(record)
            if fit:
                name, keys = _fit_kind(record, fit, run)
                found.setdefault(name, {})[tuple(fit[k] for k in keys)] = None
        if "target_text" in raw:
            facts["target text"] = repr(raw["target_text"])
        if "scored positions" in raw:
            facts["scored response positions"] = raw["scored positions"]
    for setting, found in numbers.items():
        for name, models in found.items():
            info[setting][name] = _fact(name, list(models))
    return info


def _fact(name: str, values: list[tuple[float, ...]]) -> str:
    """One model's figures, or the mean over several models with the last figure's range."""
    mean = [sum(v[i] for v in values) / len(values) for i in range(len(values[0]))]
    if name.startswith("pretraining"):
        text = f"{mean[0]:.2f} -> {mean[1]:.2f} in {round(mean[2])} steps"
    elif "MSE" in name:
        text = f"{mean[0]:.4f} / {mean[1]:.3f}"
    else:
        text = f"{mean[0]:.3f} / {mean[1]:.3f}"
    if len(values) == 1:
        return text
    last = [v[1] for v in values]
    spread = f"{min(last):.3f} to {max(last):.3f}"
    return f"mean over {len(values)} models {text} (the second from {spread})"


def write_outputs(cfg: AblateConfig, *, command: str, earlier: Sequence[Path] = ()) -> Outputs:
    """results.csv, figures and report.md of the whole plan, from the results in the output
    folder, and for runs it does not hold, from the rows of ``earlier`` results.csv files
    (of earlier runs of this config: their rows are used as written, and the report says
    how many runs came from them).

    Raises ``ConfigError`` naming the missing runs when some have no result yet."""
    out = Path(cfg.output_dir)
    plan = plan_runs(cfg)
    found, missing = collect(plan, out, fingerprints(cfg, plan))
    mixed = [_mixed_line(k, b) for k, b in mixed_builds(cfg, found).items()]
    if mixed:
        raise ConfigError(
            f"{len(mixed)} pairs of runs were trained on different builds of their models "
            f"(their recorded info differs: rebuilt on another machine or code version): "
            f"{'; '.join(mixed[:5])}{' ...' if len(mixed) > 5 else ''}; run the config "
            "again (it retrains the runs whose build is not the cache's), then report"
        )
    adopted: dict[RunKey, list[dict[str, Any]]] = {}
    if missing and earlier:
        earlier_rows = group_runs(row for path in earlier for row in read_csv(path))
        adopted = {run: earlier_rows[run] for run in missing if run in earlier_rows}
        missing = [run for run in missing if run not in adopted]
    if missing:
        names = ", ".join(r.relpath for r in missing[:10])
        more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
        raise ConfigError(
            f"{len(missing)} of {len(plan)} runs have no result for this config yet "
            f"({names}{more}); run the missing shards (or the whole config) first"
        )
    rows = [
        row
        for run in plan
        for row in (result_rows(run, found[run]) if run in found else adopted[run])
    ]
    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / CSV_FILE
    write_csv(csv_path, rows)
    rows = read_csv(csv_path)
    spec = summary_spec(cfg)
    tables, verdicts = summarize(rows, spec)
    compared = (
        head_to_head(rows, spec, cfg.report.contenders, cfg.report.published)
        if cfg.report.contenders and cfg.report.published
        else []
    )
    verdicts, compared = judge(verdicts, compared, spec)
    fig_dir = out / FIGURES_DIR
    by_setting: dict[str, list[Path]] = {}
    for s in spec.settings:
        paths = [
            figs.plot_curves(
                fig_dir / f"curves_{s.name}.png",
                title=s.title,
                rows=[r for r in rows if r["setting"] == s.name],
                families=list(cfg.families),
                strategies=spec.strategies,
                confidence=spec.confidence,
                baseline=spec.baseline,
                smooth=spec.smooth,
            )
        ]
        setting_rows = [r for r in rows if r["setting"] == s.name]
        if any("probe_metric" in r for r in setting_rows):
            paths.append(
                figs.plot_probes(
                    fig_dir / f"probes_{s.name}.png",
                    title=s.title,
                    rows=setting_rows,
                    families=list(cfg.families),
                    strategies=spec.strategies,
                    confidence=spec.confidence,
                    baseline=spec.baseline,
                )
            )
        shown = next(
            (r for r in found if r.setting == s.name and found[r].get("credit_examples")), None
        )
        if shown is not None:
            paths.append(
                figs.plot_credit(
                    fig_dir / f"credit_{s.name}.png",
                    title=f"{s.title}: {shown.family}, {shown.strategy}, seed {shown.seed}, "
                    "final policy",
                    examples=found[shown]["credit_examples"],
                )
            )
        by_setting[s.name] = paths
    total = sum(
        float(found[r]["wall_s"]) if r in found else float(adopted[r][0]["wall_s"]) for r in plan
    )
    threads = sorted({int(found[r].get("threads", 0)) for r in found})
    preamble = [
        "",
        f"{len(plan)} runs: {len(cfg.settings)} settings x {len(cfg.families)} "
        f"{'family' if len(cfg.families) == 1 else 'families'} "
        f"({', '.join(cfg.families)}) x {len(cfg.strategies)} strategies x {len(cfg.seeds)} "
        f"seeds ({', '.join(map(str, cfg.seeds))})"
        + "".join(
            f"; `{st.label}` only in {', '.join(st.settings)}"
            for st in cfg.strategies
            if st.settings is not None
        )
        + f"; training wall time summed over runs "
        f"{total / 60:.1f} min on {', '.join(map(str, threads))} torch thread(s) "
        "(pretraining and reward-model training not included; they are cached).",
        "Seeds: "
        + (
            "each seed sets the RL sampling, the policy's pretraining and the reward model's "
            "training (`model_seeds`): every (family, seed) pair has its own pretrained "
            "policy and reward model."
            if cfg.model_seeds
            else "a seed sets the RL sampling only; every seed of a (setting, family) starts "
            "from the same pretrained policy and reward model, so the intervals leave out "
            "their variance (`model_seeds: false`)."
        ),
    ]
    if adopted:
        sources = ", ".join(f"`{p}`" for p in earlier)
        preamble.append(
            f"{len(adopted)} of the {len(plan)} runs were not rerun: their rows are read as "
            f"written from the results of an earlier run of this config ({sources})."
        )
    sections = []
    if compared:
        figure = figs.plot_head_to_head(fig_dir / "head_to_head.png", compared)
        reference = reference_baselines(cfg)
        (out / STRONGEST_FILE).write_text(json.dumps(strongest_baselines(compared), indent=1))
        section = head_to_head_markdown(
            compared,
            spec.min_pairs,
            reference,
            f"`{cfg.report.reference}`",
            secondary=spec.primary_family is not None,
        )
        rel = figure.relative_to(out).as_posix()
        sections.append(f"{section}\n\n![head_to_head]({rel})")
        by_setting.setdefault("", []).append(figure)
    primary = None if spec.primary_family is None else primary_family(rows, spec)
    fidelity = setting_fidelity(found, cfg.families, cfg.model_seeds)
    sweeps = config_sweeps(cfg) + declared_sweeps(cfg, fidelity)
    if sweeps:
        grpo = None if primary is None else primary.grpo_rows()
        swept = [sweep_table(rows, spec, w, grpo) for w in sweeps]
        paths = [figs.plot_sweep(fig_dir / f"sweep_{t.sweep.label}.png", t) for t in swept]
        sections.append(
            sweep_markdown(
                swept,
                [p.relative_to(out).as_posix() for p in paths],
                secondary=spec.primary_family is not None,
            )
        )
        by_setting.setdefault("", []).extend(paths)
    if cfg.report.gate_criteria is not None:
        judged = gate_criteria(rows, spec, cfg.report.gate_criteria)
        sections.append(gate_criteria_markdown(judged, spec.confidence))
    for measure in MEASURES:
        agreement = agreement_gains(rows, spec, cfg, measure)
        if agreement:
            path = figs.plot_agreement(fig_dir / f"{measure.figure}.png", agreement)
            sections.append(agreement_markdown(agreement, path.relative_to(out).as_posix()))
            by_setting.setdefault("", []).append(path)
    sections.append(provenance_markdown(rows, code_version()))
    report = render_report(
        title=cfg.name,
        command=command,
        spec=spec,
        tables=tables,
        verdicts=verdicts,
        figures=by_setting,
        setting_info=_setting_info(found),
        setting_tables={n: fidelity_markdown(f) for n, f in fidelity.items()},
        preamble=preamble,
        sections=sections,
        primary=None if primary is None else primary_markdown(primary, spec),
        relative_to=out,
    )
    report_path = out / REPORT_FILE
    report_path.write_text(report)
    return Outputs(report_path, csv_path, [p for ps in by_setting.values() for p in ps])
