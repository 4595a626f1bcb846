"""The ablation runner end to end, on a tiny version of configs/ablate/quick.yaml.

- The quick config with 2 steps per run (through the CLI, with its 2 worker processes)
  writes report.md, results.csv with a row for every setting / family / strategy / seed and
  step, and figures that are valid PNGs; it prints their paths last.
- Resume: deleting one run's result and running again redoes that run only (and, redone
  in-process, it reproduces what a worker process computed).
- A bank (``banked``, ``python -m ablations bank``) carries the finished runs to an empty
  output folder: nothing is trained again and the results table is the same.
- ``--shard 0/2`` + ``--shard 1/2`` + ``merge`` gives the same results table as one
  unsharded run (every column but the timing ones, which are measurements).
- A stop signal in the middle of a run ends the command with that run named and exit 75;
  the rerun redoes that run only.

Sizes are cut down with ``--set`` (tiny pretraining, tiny reward models, 2 prompts x 2
samples, 2 steps) so the module stays well under two minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest

from ablations.__main__ import main
from ablations.ablation_config import load_ablate_config
from ablations.figures import is_png
from ablations.results import RESULT_FILE, TIMING_COLUMNS, read_csv
from ablations.runner import (
    CSV_FILE,
    REPORT_FILE,
    merge,
    plan_runs,
    run_ablation,
    write_outputs,
)
from ablations.settings import SETTINGS
from backends.common.errors import ConfigError
from backends.common.preemption import PREEMPTED_EXIT
from tests.helpers.paths import REPO

pytestmark = pytest.mark.slow

QUICK = REPO / "configs" / "ablate" / "quick.yaml"
#: The settings of quick.yaml: the sparse setting where DATC gains, one dense setting.
QUICK_SETTINGS = ("positional_sparse", "target_tokens")
#: Runs of the tiny quick config: one family x two seeds x (5 strategies in the sparse
#: setting + 3 in the dense one).
TINY_RUNS = 1 * 2 * (5 + 3)
TINY_TASK = (
    "{num_train: 16, num_held_out: 4, num_pretrain: 32, pretrain: {steps: 2, batch_size: 4},"
    " rm: {examples: 32, steps: 2, batch_size: 8, hidden: 16}}"
)
TINY = [
    "families=[llama]",
    "seeds=[0, 1]",
    "train.steps=2",
    "train.eval.interval=1",
    "train.rollout.group_size=2",
    "train.rollout.prompts_per_step=2",
    "train.data.num_eval_prompts=2",
    "report.heatmap_responses=2",
    *(f"settings.{name}.train={{steps: 2, eval: {{interval: 1}}}}" for name in QUICK_SETTINGS),
    f"settings.target_tokens.params={TINY_TASK}",
    "settings.positional_sparse.params={num_train: 16, num_held_out: 4, num_pretrain: 32, "
    "pretrain: {steps: 2, batch_size: 4}}",
    "probes={prompts: 2, metric_samples: 4}",
]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ablate_cache")


@pytest.fixture(scope="module")
def quick_run(
    tmp_path_factory: pytest.TempPathFactory, cache: Path
) -> tuple[Path, list[str], list[str]]:
    """The tiny quick config run through the CLI; (output dir, overrides, printed lines)."""
    out = tmp_path_factory.mktemp("quick")
    overrides = [*TINY, f"output_dir={out}", f"cache_dir={cache}"]
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main([str(QUICK), *(x for o in overrides for x in ("--set", o))])
    assert code == 0, buf.getvalue()
    return out, overrides, buf.getvalue().strip().splitlines()


def test_quick_config_writes_every_output(quick_run: tuple[Path, list[str], list[str]]) -> None:
    out, overrides, printed = quick_run
    cfg = load_ablate_config(QUICK, overrides)
    assert cfg.workers == 2 and list(cfg.settings) == list(QUICK_SETTINGS)
    rows = read_csv(out / CSV_FILE)
    runs = {(r["setting"], r["family"], r["strategy"], r["seed"]) for r in rows}
    expected = {(r.setting, r.family, r.strategy, r.seed) for r in plan_runs(cfg)}
    assert runs == expected and len(expected) == TINY_RUNS
    for run in expected:
        steps = sorted(
            r["step"] for r in rows if (r["setting"], r["family"], r["strategy"], r["seed"]) == run
        )
        assert steps == [0, 1, 2]
    last = [r for r in rows if r["step"] == 2]
    assert all("eval_reward_sampled" in r and "reward_mean" in r and "time_step" in r for r in last)
    assert all("extra_task_score_sampled" in r for r in last if r["setting"] == "target_tokens")
    # the probes at every evaluation; an exact-credit correlation only where a rule exists
    evals = [r for r in rows if "eval_reward_sampled" in r]
    assert all("probe_metric" in r for r in evals)  # NaN probes (zero gradients) are empty
    assert any("probe_grad_cos" in r and "probe_grad_split_half" in r for r in evals)
    probed = {r["setting"] for r in evals if "probe_credit_corr" in r}
    assert probed <= set(QUICK_SETTINGS)
    assert not any("probe_credit_corr" in r for r in evals if r["strategy"] == "uniform")
    kinds = [SETTINGS[name] for name in QUICK_SETTINGS]
    report = (out / REPORT_FILE).read_text()
    for kind in kinds:
        assert f"## {kind.title}" in report
    assert "## Verdicts" in report and "credit corr" in report
    for kind in kinds:  # one verdict line per setting
        assert sum(line.startswith(f"- {kind.title}:") for line in report.splitlines()) == 1
    # the contenders against the published baseline where it ran (the sparse setting)
    assert "## Against the published baselines" in report
    assert "| `datc_mid` | all |" in report and "vs `entropy_top`" in report
    assert "## Sweeps" not in report  # two settings of two kinds: no sweep
    figures = sorted((out / "figures").glob("*.png"))
    names = {f.name for f in figures}
    assert {f"curves_{name}.png" for name in QUICK_SETTINGS} <= names
    assert {f"probes_{name}.png" for name in QUICK_SETTINGS} <= names
    assert any(n.startswith("credit_") for n in names) and "head_to_head.png" in names
    assert all(is_png(f) for f in figures)
    # the CLI ends with the report and the figures
    assert printed[-len(figures) - 2].endswith(str(out / REPORT_FILE))
    assert {Path(line.split()[-1]).name for line in printed[-len(figures) :]} == names


def test_resume_redoes_only_the_deleted_run(
    quick_run: tuple[Path, list[str], list[str]], tmp_path: Path
) -> None:
    src, overrides, _ = quick_run
    out = tmp_path / "copy"
    shutil.copytree(src, out)
    cfg = load_ablate_config(QUICK, [*overrides, f"output_dir={out}", "workers=1"])
    plan = plan_runs(cfg)
    victim = plan[5]
    before = {r: (r.folder(out) / RESULT_FILE).read_bytes() for r in plan if r != victim}
    original = _measured(victim.folder(out) / RESULT_FILE)
    (victim.folder(out) / RESULT_FILE).unlink()  # its train/ folder stays, half a run
    logs: list[str] = []
    run_ablation(cfg, command="test", log=logs.append)
    assert any(f", {TINY_RUNS - 1} already done, 1 to run" in line for line in logs), logs
    # redone in this process, it reproduces what the worker process computed
    assert _measured(victim.folder(out) / RESULT_FILE) == original
    for run, content in before.items():
        assert (run.folder(out) / RESULT_FILE).read_bytes() == content, run
    # a second pass has nothing to do
    logs.clear()
    run_ablation(cfg, command="test", log=logs.append)
    assert any(" 0 to run" in line for line in logs), logs


def test_a_run_of_another_build_of_its_models_is_trained_again_not_paired(
    quick_run: tuple[Path, list[str], list[str]], tmp_path: Path
) -> None:
    """A pair is compared on one build of its models: a finished run whose recorded info
    differs from its pair's (its models rebuilt on another machine or code version, e.g.
    from a bank) stops the report, and the next pass trains it again on the cache's build."""
    src, overrides, _ = quick_run
    out = tmp_path / "copy"
    shutil.copytree(src, out)
    cfg = load_ablate_config(QUICK, [*overrides, f"output_dir={out}", "workers=1"])
    victim = plan_runs(cfg)[5]
    file = victim.folder(out) / RESULT_FILE
    original, measured = json.loads(file.read_text()), _measured(file)
    elsewhere = {**original, "info": {**original["info"], "rebuilt": "elsewhere"}}
    file.write_text(json.dumps(elsewhere))
    with pytest.raises(ConfigError, match="1 pairs of runs were trained on different builds"):
        write_outputs(cfg, command="test")
    logs: list[str] = []
    run_ablation(cfg, command="test", log=logs.append)
    assert any(
        "1 finished runs of" in line and line.endswith(f"trained again: {victim.strategy}")
        for line in logs
    ), logs
    assert json.loads(file.read_text())["info"] == original["info"]
    assert _measured(file) == measured  # trained again on the cache's build: the same run


def test_a_bank_carries_the_finished_runs_to_another_output_folder(
    quick_run: tuple[Path, list[str], list[str]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    src, overrides, _ = quick_run
    banked = [*overrides, f"banked=[{tmp_path / 'bank'}]"]
    args = [str(QUICK), *(x for o in banked for x in ("--set", o))]
    assert main(["bank", *args]) == 0
    assert f"wrote {tmp_path / 'bank'}" in capsys.readouterr().out
    assert main(["bank", *args]) == 0  # each deposit adds only what the bank lacks
    assert "nothing new to add" in capsys.readouterr().out
    elsewhere = load_ablate_config(
        QUICK, [*banked, f"output_dir={tmp_path / 'elsewhere'}", "workers=1"]
    )
    logs: list[str] = []
    outputs = run_ablation(elsewhere, command="test", log=logs.append)
    assert f"[ablate] {TINY_RUNS} finished runs taken from the bank" in logs[0], logs
    assert any(f", {TINY_RUNS} already done, 0 to run" in line for line in logs), logs
    assert outputs is not None and _table(outputs.csv) == _table(src / CSV_FILE)


def _measured(result_file: Path) -> list[dict[str, float]]:
    """A run's logged metrics without the timings (which are measurements, not results)."""
    history = json.loads(result_file.read_text())["history"]
    return [
        {k: v for k, v in r.items() if not k.startswith(("time/", "throughput/"))} for r in history
    ]


def _table(path: Path) -> list[dict[str, object]]:
    return [{k: v for k, v in row.items() if k not in TIMING_COLUMNS} for row in read_csv(path)]


def test_shards_and_merge_equal_the_unsharded_run(cache: Path, tmp_path: Path) -> None:
    subset = [
        *TINY,
        f"cache_dir={cache}",
        "workers=1",
        "settings={target_tokens: {}, verifiable: {}}",
        f"settings.target_tokens.params={TINY_TASK}",
        f"settings.verifiable.params={TINY_TASK}",
        "settings.target_tokens.train={steps: 2, eval: {interval: 1}}",
        "settings.verifiable.train={steps: 2, eval: {interval: 1}}",
        "strategies=[uniform, datc]",
        "control=null",
        "report={contenders: [], published: []}",
    ]
    subset = [s for s in subset if not s.startswith("settings.minilm")]
    whole = load_ablate_config(QUICK, [*subset, f"output_dir={tmp_path / 'whole'}"])
    shards = [
        load_ablate_config(QUICK, [*subset, f"output_dir={tmp_path / f's{i}'}"]) for i in (0, 1)
    ]
    run_ablation(whole, command="test", log=lambda m: None)
    for i, cfg in enumerate(shards):
        assert (
            run_ablation(cfg, command="test", shard_index=i, shard_count=2, log=lambda m: None)
            is None
        )
        done = list((tmp_path / f"s{i}").rglob(RESULT_FILE))
        assert len(done) == len(plan_runs(cfg)) // 2
    merged = load_ablate_config(QUICK, [*subset, f"output_dir={tmp_path / 'merged'}"])
    outputs = merge(merged, [tmp_path / "s0", tmp_path / "s1"], command="test")
    assert _table(outputs.csv) == _table(tmp_path / "whole" / CSV_FILE)
    assert len(_table(outputs.csv)) == 2 * 2 * 2 * 3
    # runs no folder holds are read from an earlier results.csv, as written, and counted
    adopting = load_ablate_config(QUICK, [*subset, f"output_dir={tmp_path / 'adopted'}"])
    outputs = merge(
        adopting, [tmp_path / "s0"], command="test", earlier=[tmp_path / "whole" / CSV_FILE]
    )
    assert _table(outputs.csv) == _table(tmp_path / "whole" / CSV_FILE)
    half = len(plan_runs(adopting)) // 2
    assert f"{half} of the {2 * half} runs were not rerun" in outputs.report.read_text()
    # `only`: one strategy's runs now, no report; merged with the earlier rows, the same table
    partial = load_ablate_config(
        QUICK, [*subset, f"output_dir={tmp_path / 'partial'}", "only=[datc]"]
    )
    logs = []
    assert run_ablation(partial, command="test", log=logs.append) is None
    assert any(", 4 to run" in m for m in logs) and any("merge" in m for m in logs[-1:]), logs
    assert {p.parent.parent.name for p in (tmp_path / "partial").rglob(RESULT_FILE)} == {"datc"}
    outputs = merge(
        partial, [tmp_path / "partial"], command="test", earlier=[tmp_path / "whole" / CSV_FILE]
    )
    assert _table(outputs.csv) == _table(tmp_path / "whole" / CSV_FILE)
    # a changed strategy redoes that strategy's runs only
    changed = load_ablate_config(
        QUICK,
        [
            *subset,
            f"output_dir={tmp_path / 'whole'}",
            "strategies=[uniform, {name: datc, beta: 2.0}]",
        ],
    )
    logs = []
    run_ablation(changed, command="test", log=logs.append)
    assert any("4 to run (4 of them done before with another config)" in m for m in logs), logs


def test_merge_names_missing_runs(cache: Path, tmp_path: Path) -> None:
    from backends.common.errors import ConfigError

    cfg = load_ablate_config(
        QUICK, [*TINY, f"cache_dir={cache}", f"output_dir={tmp_path / 'm'}", "workers=1"]
    )
    with pytest.raises(
        ConfigError,
        match=rf"{TINY_RUNS} of {TINY_RUNS} runs have no result for this config yet "
        r"\(positional_sparse/",
    ):
        merge(cfg, [tmp_path / "nowhere"], command="test")


def test_a_signalled_run_stops_the_worker_with_its_run_named_and_a_rerun_continues(
    quick_run: tuple[Path, list[str], list[str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """SIGTERM in the middle of a run: the run ends after its step, the command says which
    run stopped and exits 75; the rerun redoes that run only."""
    from backends.torch.trainer import GRPORecipe

    src, overrides, _ = quick_run
    out = tmp_path / "copy"
    shutil.copytree(src, out)
    cfg = load_ablate_config(QUICK, [*overrides, f"output_dir={out}", "workers=1"])
    victim = plan_runs(cfg)[3]
    (victim.folder(out) / RESULT_FILE).unlink()
    real = GRPORecipe.signals

    def signals(self: GRPORecipe, *args: Any, **kwargs: Any) -> Any:
        if self.step == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(self, *args, **kwargs)

    argv = [
        str(QUICK),
        *(x for o in [*overrides, f"output_dir={out}", "workers=1"] for x in ("--set", o)),
    ]
    with monkeypatch.context() as mp:
        mp.setattr(GRPORecipe, "signals", signals)
        assert main(argv) == PREEMPTED_EXIT
    err = capsys.readouterr().err
    assert f"credit-ablate: run {victim.relpath}: SIGTERM received, stopped after step 1" in err
    assert not (victim.folder(out) / RESULT_FILE).exists()
    assert main(argv) == 0
    assert f", {TINY_RUNS - 1} already done, 1 to run" in capsys.readouterr().out
