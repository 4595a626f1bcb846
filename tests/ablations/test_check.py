"""Provenance end to end and ``python -m ablations check`` on a tiny config (docs/design.md,
"Evaluation"): a run may be carried over only where rerunning it repeats it.

- Every run's ``result.json`` and results.csv rows name the commit of the checkout that
  trained it (``git rev-parse HEAD``, asked here directly), and the report lists it in its
  Provenance section.
- ``check`` reruns a seeded sample of the recorded runs: an unchanged record is identical
  (exit 0); a record whose held-out reward or exact score was altered differs by exactly
  the alteration (exit 1), within a tolerance above it it passes; bad input exits 2.

One setting (target tokens, tiny models), ``uniform`` and ``datc``, one family, two seeds,
2 steps each: a few seconds.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from ablations.__main__ import main
from ablations.ablation_config import load_ablate_config
from ablations.check import differences
from ablations.results import RESULT_FILE, read_csv
from ablations.runner import CSV_FILE, REPORT_FILE, plan_runs
from tests.ablations.test_runner import QUICK, TINY, TINY_TASK
from tests.helpers.paths import REPO

SETTING = [
    *(o for o in TINY if not o.startswith("settings.")),
    "workers=1",
    "settings={target_tokens: {}}",
    f"settings.target_tokens.params={TINY_TASK}",
    "settings.target_tokens.train={steps: 2, eval: {interval: 1}}",
    "strategies=[uniform, datc]",
    "control=null",
    "report={contenders: [], published: []}",
]


def _argv(*options: str, overrides: list[str], check: bool = True) -> list[str]:
    """``check QUICK OPTIONS --set ...`` (without ``check``: the run itself)."""
    head = ["check"] if check else []
    return [*head, str(QUICK), *options, *(x for o in overrides for x in ("--set", o))]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """The tiny config run through the CLI; (output dir, overrides)."""
    out = tmp_path_factory.mktemp("recorded")
    cache = tmp_path_factory.mktemp("cache")
    overrides = [*SETTING, f"output_dir={out}", f"cache_dir={cache}"]
    assert main(_argv(overrides=overrides, check=False)) == 0
    return out, overrides


def _head() -> tuple[str, bool]:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True
        ).stdout

    code = ("credit_core", "adapters", "backends", "ablations")
    status = git("status", "--porcelain", "--untracked-files=no", "--", *code)
    return git("rev-parse", "HEAD").strip(), bool(status.strip())


def test_every_run_and_row_names_its_commit_and_the_report_lists_it(
    recorded: tuple[Path, list[str]],
) -> None:
    out, overrides = recorded
    head, dirty = _head()
    label = head + ("-dirty" if dirty else "")
    runs = plan_runs(load_ablate_config(QUICK, overrides))
    assert len(runs) == 4
    for run in runs:
        assert json.loads((run.folder(out) / RESULT_FILE).read_text())["code"] == label
    rows = read_csv(out / CSV_FILE)
    assert len(rows) == 4 * 3 and {r["commit"] for r in rows} == {label}
    report = (out / REPORT_FILE).read_text()
    short = head[:7] + ("-dirty" if dirty else "")
    assert "## Provenance" in report
    line = next(x for x in report.splitlines() if x.startswith(f"| `{short}` |"))
    assert "| 4 | target_tokens/`uniform`, target_tokens/`datc` |" in line
    assert ("**flagged: uncommitted changes**" in line) == dirty


def test_an_unchanged_rerun_is_identical(
    recorded: tuple[Path, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    _, overrides = recorded
    assert main(_argv("--sample", "2", "--seed", "1", overrides=overrides)) == 0
    printed = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("identical target_tokens/llama/") for line in printed) == 2
    assert printed[-1].startswith("[check] 2 of 2 rerun runs identical to their record")


@pytest.mark.slow
def test_an_altered_record_differs_by_the_alteration(
    recorded: tuple[Path, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, overrides = recorded
    out = tmp_path / "copy"
    shutil.copytree(src, out)
    overrides = [*overrides, f"output_dir={out}"]
    first, second, *_ = plan_runs(load_ablate_config(QUICK, overrides))
    # the held-out reward of the first run's last evaluation, the exact score of the second
    file = first.folder(out) / RESULT_FILE
    result = json.loads(file.read_text())
    result["history"][-1]["eval/reward_sampled"] += 0.25
    file.write_text(json.dumps(result))
    file = second.folder(out) / RESULT_FILE
    result = json.loads(file.read_text())
    result["extra"]["task_score_sampled"] -= 0.5
    file.write_text(json.dumps(result))

    assert main(_argv("--sample", "4", overrides=overrides)) == 1
    printed = capsys.readouterr().out.splitlines()
    # "identical <run> (...)" or "differs by <gap> <run> (...): <metric> <was> -> <now>"
    lines = {line.split()[1 if line.startswith("identical") else 3]: line for line in printed[1:-1]}
    assert lines[first.relpath].startswith("differs by 0.25 ")
    assert "eval_reward_sampled" in lines[first.relpath]
    assert lines[second.relpath].startswith("differs by 0.5 ")
    assert "extra_task_score_sampled" in lines[second.relpath]
    assert sum(line.startswith("identical ") for line in lines.values()) == 2
    assert printed[-1].endswith("(tolerance 0); 2 differ")
    # a tolerance above both alterations (the file keeps 7 significant digits) passes
    assert main(_argv("--sample", "4", "--tolerance", "0.51", overrides=overrides)) == 0


def test_the_rows_of_a_results_csv_can_be_checked(
    recorded: tuple[Path, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--rows``: the recorded figures come from a results.csv (the rows `merge --rows`
    would carry over); an older one without the commit column names it unknown."""
    out, overrides = recorded
    older = tmp_path / "older.csv"
    rows = (out / CSV_FILE).read_text().splitlines()
    header = rows[0].split(",")
    at = header.index("commit")
    older.write_text(
        "\n".join(",".join(c for i, c in enumerate(r.split(",")) if i != at) for r in rows)
    )
    argv = _argv("--sample", "1", "--rows", str(older), overrides=overrides)
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "recorded by unknown, rerun by" in printed


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--sample", "5"], "--sample 5: only 4 recorded runs of this config"),
        (["--sample", "0"], "--sample: expected at least 1 run, got 0"),
        (["--sample", "1", "--tolerance", "-1"], "--tolerance: expected a number >= 0"),
    ],
)
def test_bad_input_is_one_message_and_exit_2(
    recorded: tuple[Path, list[str]],
    extra: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, overrides = recorded
    assert main(_argv(*extra, overrides=overrides)) == 2
    err = capsys.readouterr().err
    assert f"credit-ablate: error: {message}" in err


def test_nan_is_equal_only_to_nan_and_absence_differs() -> None:
    nan = float("nan")
    assert differences({"a": nan, "b": 1.0}, {"a": nan, "b": 1.0}, 0.0) == {}
    assert differences({"a": nan}, {"a": 0.5}, 1.0) == {"a": float("inf")}
    assert differences({"a": 0.5}, {}, 1.0) == {"a": float("inf")}
    assert differences({"a": 0.5}, {"a": 0.75}, 0.0) == {"a": 0.25}
    assert differences({"a": 0.5}, {"a": 0.75}, 0.25) == {}
