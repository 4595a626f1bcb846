"""The bank of finished runs (``ablations.bank``): what goes in comes out, only for the
config that made it, and a damaged bank is one error naming the file and line."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from ablations.bank import banked_results, deposit, withdraw
from ablations.results import RESULT_FILE, RunKey, read_result, write_result

RUNS = [RunKey("s", "llama", "datc", 0), RunKey("s", "llama", "uniform", 0)]


def _finished(output: Path, fingerprints: dict[RunKey, str]) -> None:
    for run, fingerprint in fingerprints.items():
        run.folder(output).mkdir(parents=True)
        write_result(run.folder(output), {"fingerprint": fingerprint, "history": [{"step": 1}]})


def test_a_deposit_comes_back_for_the_same_config_only(tmp_path: Path) -> None:
    prints = {run: f"fp-{run.strategy}" for run in RUNS}
    _finished(tmp_path / "out", prints)
    bank = tmp_path / "bank"
    first = deposit([bank], tmp_path / "out", RUNS, prints)
    assert first is not None and deposit([bank], tmp_path / "out", RUNS, prints) is None
    # a run another bank holds is not deposited again
    assert deposit([tmp_path / "own", bank], tmp_path / "out", RUNS, prints) is None
    assert [run for run, _ in banked_results([bank])] == RUNS
    assert withdraw([bank], tmp_path / "fresh", prints) == 2
    for run in RUNS:
        assert read_result(run.folder(tmp_path / "fresh"), prints[run]) is not None
    assert withdraw([bank], tmp_path / "fresh", prints) == 0  # already there
    changed = {**prints, RUNS[0]: "fp-datc-beta2"}
    assert withdraw([bank], tmp_path / "other", changed) == 1  # the changed run is not taken
    assert not (RUNS[0].folder(tmp_path / "other") / RESULT_FILE).exists()


def test_a_damaged_bank_names_the_file_and_line(tmp_path: Path) -> None:
    bank = tmp_path / "bank"
    bank.mkdir()
    with gzip.open(bank / "a.jsonl.gz", "wt") as fh:
        fh.write('{"run": ["s", "llama", "datc", 0], "result": {"fingerprint": "x"}}\n')
        fh.write('{"run": ["s", "llama"], "result": {}}\n')
    with pytest.raises(ValueError, match=r"a\.jsonl\.gz, line 2"):
        list(banked_results([bank]))


def test_a_run_trained_again_on_a_new_build_is_banked_and_comes_back_first(
    tmp_path: Path,
) -> None:
    """A run the bank holds on one build of its models, trained again on another (the
    runner's build guard), is deposited beside it; a withdrawal takes the latest deposit's."""
    prints = {run: f"fp-{run.strategy}" for run in RUNS}
    bank, out = tmp_path / "bank", tmp_path / "out"
    for run, fingerprint in prints.items():
        run.folder(out).mkdir(parents=True)
        write_result(run.folder(out), {"fingerprint": fingerprint, "info": {"rm_loss": 0.5}})
    first = deposit([bank], out, RUNS, prints)
    rebuilt = {"fingerprint": prints[RUNS[0]], "info": {"rm_loss": 0.25}}
    write_result(RUNS[0].folder(out), rebuilt)
    second = deposit([bank], out, RUNS, prints)
    assert first is not None and second is not None and first.name < second.name
    assert [run for run, _ in banked_results([bank])] == [*RUNS, RUNS[0]]
    assert deposit([bank], out, RUNS, prints) is None  # that build is banked now
    assert withdraw([bank], tmp_path / "fresh", prints) == 2
    got = read_result(RUNS[0].folder(tmp_path / "fresh"), prints[RUNS[0]])
    assert got is not None and got["info"] == {"rm_loss": 0.25}


def test_the_latest_deposit_wins_across_banks_whichever_bank_holds_it(tmp_path: Path) -> None:
    """A config reading two banks (e.g. its own and a sibling plan's that shares runs): a run
    held on an older build in the first bank and a newer build in the second comes back on
    the newer one, so a pair is not withdrawn on two builds (the runner would train it again)."""
    prints = {run: f"fp-{run.strategy}" for run in RUNS}
    own, sibling, out = tmp_path / "own", tmp_path / "sibling", tmp_path / "out"
    for run, fingerprint in prints.items():
        run.folder(out).mkdir(parents=True)
        write_result(run.folder(out), {"fingerprint": fingerprint, "info": {"rm_loss": 0.5}})
    older = deposit([own], out, RUNS, prints)
    for run, fingerprint in prints.items():
        write_result(run.folder(out), {"fingerprint": fingerprint, "info": {"rm_loss": 0.25}})
    newer = deposit([sibling], out, RUNS, prints)
    assert older is not None and newer is not None and older.name < newer.name
    for banks in ([own, sibling], [sibling, own]):
        fresh = tmp_path / f"fresh-{banks[0].name}"
        assert withdraw(banks, fresh, prints) == 2
        for run in RUNS:
            got = read_result(run.folder(fresh), prints[run])
            assert got is not None and got["info"] == {"rm_loss": 0.25}
