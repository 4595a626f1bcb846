"""Which code produced each run (``ablations.provenance``; docs/design.md, "Evaluation").

- The code version of a checkout is its ``HEAD``, ``-dirty`` when a tracked file under the
  code folders differs from it (not an untracked file, not a file outside them), and
  ``unknown`` outside a git repository.
- A results.csv written before the ``commit`` column reads as ``unknown``; a run's rows
  carry the label its ``result.json`` records.
- The report's Provenance section counts the runs and groups of each version and flags
  the unknown and dirty ones.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ablations.provenance import CodeVersion, provenance_markdown, read_code_version
from ablations.results import RunKey, read_csv, result_rows, write_csv

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run([*GIT, "-C", str(repo), *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository with one commit holding a file under credit_core/ and a README."""
    root = tmp_path / "repo"
    (root / "credit_core").mkdir(parents=True)
    (root / "credit_core" / "x.py").write_text("A = 1\n")
    (root / "README.md").write_text("readme\n")
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "one")
    return root


def test_a_clean_checkout_is_its_head(repo: Path) -> None:
    head = _git(repo, "rev-parse", "HEAD")
    assert len(head) == 40
    assert read_code_version(repo) == CodeVersion(head, dirty=False)
    assert read_code_version(repo).label == head and read_code_version(repo).traceable


def test_a_changed_tracked_code_file_makes_it_dirty(repo: Path) -> None:
    head = _git(repo, "rev-parse", "HEAD")
    (repo / "credit_core" / "x.py").write_text("A = 2\n")
    version = read_code_version(repo)
    assert version == CodeVersion(head, dirty=True)
    assert version.label == head + "-dirty" and version.short == head[:7] + "-dirty"
    assert not version.traceable


def test_untracked_files_and_files_outside_the_code_folders_do_not(repo: Path) -> None:
    (repo / "credit_core" / "new.py").write_text("B = 1\n")  # untracked
    (repo / "README.md").write_text("edited\n")  # tracked, outside the code folders
    assert not read_code_version(repo).dirty


def test_outside_a_repository_the_version_is_unknown(tmp_path: Path) -> None:
    version = read_code_version(tmp_path)
    assert version.label == "unknown" and not version.traceable


@pytest.mark.parametrize(
    "label", ["0123456789abcdef0123456789abcdef01234567", "0123abc-dirty", "unknown"]
)
def test_a_label_parses_back_to_its_version(label: str) -> None:
    assert CodeVersion.parse(label).label == label


OLDER_CSV = """setting,family,strategy,seed,step,reward_mean,eval_reward_sampled
toy,llama,uniform,0,0,,0.25
toy,llama,uniform,0,1,0.5,0.75
"""


def test_an_older_csv_without_the_column_reads_as_unknown(tmp_path: Path) -> None:
    path = tmp_path / "results.csv"
    path.write_text(OLDER_CSV)
    rows = read_csv(path)
    assert [r["commit"] for r in rows] == ["unknown", "unknown"]
    assert rows[1]["reward_mean"] == 0.5  # the other columns read as before


def test_a_runs_rows_carry_its_recorded_version_through_the_csv(tmp_path: Path) -> None:
    run = RunKey("toy", "llama", "datc", 3)
    history = [{"step": 0, "eval/reward_sampled": 0.1}, {"step": 1, "reward/mean": 0.2}]
    recorded = {"history": history, "code": "abc1234abc1234-dirty", "wall_s": 1.0}
    older = {"history": history, "wall_s": 1.0}  # a result.json written before the key
    path = tmp_path / "results.csv"
    write_csv(
        path, [*result_rows(run, recorded), *result_rows(RunKey("toy", "llama", "u", 0), older)]
    )
    assert [r["commit"] for r in read_csv(path)] == [
        "abc1234abc1234-dirty",
        "abc1234abc1234-dirty",
        "unknown",
        "unknown",
    ]


def test_the_provenance_section_counts_and_flags_each_version() -> None:
    head = "a" * 40
    old = "b" * 40

    def rows(strategy: str, seed: int, commit: str) -> list[dict[str, object]]:
        return [
            {"setting": "s1", "family": "llama", "strategy": strategy, "seed": seed, "step": k}
            | {"commit": commit}
            for k in (0, 1)
        ]

    table = [
        *rows("uniform", 0, head),
        *rows("uniform", 1, head),
        *rows("datc", 0, old),
        *rows("red", 0, "unknown"),
        *rows("abc", 0, old + "-dirty"),
    ]
    md = provenance_markdown(table, CodeVersion(head))
    assert md.startswith("## Provenance")
    lines = {line.split(" | ")[0]: line for line in md.splitlines() if line.startswith("| `")}
    assert lines["| `aaaaaaa`"] == "| `aaaaaaa` | 2 | s1/`uniform` |  |"  # two runs, one group
    assert (
        lines["| `bbbbbbb`"] == "| `bbbbbbb` | 1 | s1/`datc` | another commit than the report's |"
    )
    assert "**flagged: unknown commit**" in lines["| `unknown`"]
    assert "**flagged: uncommitted changes**" in lines["| `bbbbbbb-dirty`"]
    assert "written by `aaaaaaa`" in md
