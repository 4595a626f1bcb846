"""``credit-view``: which folders it opens, how it lays runs out, and its one-message errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ablations.results import RunKey
from ablations.runner import TRAIN_DIR
from backends.samples.cli import find_runs, main
from backends.samples.page import page_data, render_page
from backends.samples.records import SAMPLES_FILE
from tests.test_cli_contract import assert_one_message


def _record(step: int, strategy: str, tokens: list[str]) -> dict[str, object]:
    adv = [1.0] * len(tokens)
    sample = {"prompt": "p", "tokens": tokens, "reward": 1.0, "advantage": 1.0,
              "token_advantages": {strategy: adv}}  # fmt: skip
    return {"step": step, "strategy": strategy, "samples": [sample]}


def _write(folder: Path, *records: dict[str, object], tail: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in records) + tail
    (folder / SAMPLES_FILE).write_text(text)
    return folder


def test_an_ablation_folder_shows_each_setting_family_seed_with_its_strategies_side_by_side(
    tmp_path: Path,
) -> None:
    for setting, strategy, seed in [("s1", "uniform", 0), ("s1", "datc", 0), ("s1", "datc", 1)]:
        run = RunKey(setting=setting, family="llama", strategy=strategy, seed=seed)
        _write(run.folder(tmp_path) / TRAIN_DIR, _record(5, strategy, ["a"]))
    data = page_data(find_runs(tmp_path), "t")
    assert [(g["name"], [r["name"] for r in g["runs"]]) for g in data["groups"]] == [  # type: ignore[index,union-attr]
        ("s1 · llama · seed0", ["datc", "uniform"]),
        ("s1 · llama · seed1", ["datc"]),
    ]


def test_a_run_folder_page_is_written_with_a_cut_short_last_line_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _write(tmp_path / "run", _record(1, "datc", ["x"]), tail='{"step": 2, "str')
    assert main([str(run)]) == 0
    page = (run / "credit_view.html").read_text()
    assert '"1":' in page and '"2":' not in page
    assert "credit_view.html" in capsys.readouterr().out


def test_sample_text_cannot_end_the_data_element() -> None:
    from backends.samples.page import RunSamples
    from backends.samples.records import StepSamples

    record = StepSamples.model_validate(_record(1, "datc", ["</script><script>alert(1)"]))
    page = render_page([RunSamples("r", "", [record])], title="<b>t</b>")
    assert page.count("</script>") == 2 and "alert(1)" in page  # its own two elements only
    assert "<b>t</b>" not in page


@pytest.mark.parametrize(
    ("make", "fragments"),
    [
        (lambda p: p / "missing", ["RUN_DIR:", "is not a folder"]),
        (lambda p: p, ["RUN_DIR: no credit_samples.jsonl in or below"]),
        (
            lambda p: _write(
                p / "run",
                {**_record(1, "datc", ["a", "b"]), "strategy": "uniform"},
                _record(2, "datc", ["c"]),
            ),
            ["record 1: samples.0.token_advantages: has ['datc'], expected", "credit-train"],
        ),
    ],
)
def test_a_folder_without_good_samples_is_one_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: object, fragments: list[str]
) -> None:
    folder = make(tmp_path)  # type: ignore[operator]
    status = main([str(folder)])
    assert_one_message("credit-view", status, capsys.readouterr().err, *fragments)
