"""Credit samples under TRL: ``credit_samples_steps`` records a few responses' token
advantages (the run's and compared strategies', same rows, same signals) to
``credit_samples.jsonl`` and their heat-map to TRL's TensorBoard events."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.samples.records import read_samples
from backends.trl.cli import main
from tests.helpers.paths import REPO

CONFIG = str(REPO / "configs" / "trl" / "tiny_datc.yaml")


def run(tmp_path: Path, *extra: str) -> int:
    argv = ["--config", CONFIG, "--output_dir", str(tmp_path), "--max_steps", "2"]
    argv += ["--per_device_train_batch_size", "16", "--eval_samples_per_prompt", "0"]
    return main([*argv, "--credit_samples_steps", "1", *extra])


@pytest.mark.parametrize(
    ("phase", "steps"),
    [
        # on-policy: the token advantages are formed in every step's loss forward
        pytest.param([], [1, 2, 3], id="loss-phase"),
        # an old-log-prob forward: formed when TRL generates, every num_iterations steps
        pytest.param(["--num_iterations", "2"], [1, 3], id="generation-phase"),
    ],
)
def test_each_recorded_step_holds_the_runs_and_the_compared_credits(
    tmp_path: Path, phase: list[str], steps: list[int]
) -> None:
    compare = ["--credit_samples_compare", "uniform", '{"name": "datc_shuffled", "seed": 1}']
    assert run(tmp_path, *compare, "--report_to", "tensorboard", "--max_steps", "3", *phase) == 0
    records = read_samples(tmp_path / "credit_samples.jsonl")
    assert [r.step for r in records] == steps
    for record in records:
        assert record.strategy == "datc(beta=1.0, lam=0.5)"
        assert record.compare == ["uniform", "datc_shuffled(seed=1)"]
        # the config's reward model is DATC's direction model: credit-view says so
        assert record.agreement is not None and record.agreement.direction_is_reward
        assert 1 <= len(record.samples) <= 4
        assert any(s.advantage != 0 for s in record.samples)
        for s in record.samples:
            if s.advantage == 0:
                continue
            assert s.weights("uniform") == pytest.approx([1.0] * len(s.tokens))
            for label in record.labels:  # DATC keeps the response's mean advantage
                w = s.weights(label)
                assert sum(w) / len(w) == pytest.approx(1.0, abs=1e-4)  # type: ignore[arg-type]
            assert s.token_advantages[record.strategy] != s.token_advantages["uniform"]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = [EventAccumulator(str(f.parent)).Reload() for f in tmp_path.rglob("events.out.*")]
    images = [e for e in events if "credit/samples" in e.Tags()["images"]]
    assert [i.step for i in images[0].Images("credit/samples")] == steps


def test_off_and_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(tmp_path / "off", "--credit_samples_steps", "0") == 0
    assert not (tmp_path / "off" / "credit_samples.jsonl").exists()
    status = run(tmp_path / "x", "--credit", "uniform", "--credit_samples_compare", "datc")
    assert status == 2
    err = capsys.readouterr().err
    assert "credit_samples_compare.0: 'datc' reads ['unsigned_work']" in err
    assert "'uniform' computes no signal" in err
    status = run(tmp_path / "g", "--credit", "uniform", "--credit_samples_compare", "ktae")
    assert status == 2
    assert "credit_samples_compare.0: 'ktae' reads ['groups'], which" in capsys.readouterr().err


def test_entropy_top_beside_its_random_control(tmp_path: Path) -> None:
    """``credit: entropy_top`` from the command line, random_top compared: each recorded
    response holds entropy_top's mean-keeping weights and random_top's 0/1 selection, both
    taken over the whole batch."""
    own = '{"name": "entropy_top", "mode": "weight"}'
    extra = ["--credit", own, "--credit_samples_compare", "random_top", "uniform"]
    assert run(tmp_path, *extra) == 0
    records = read_samples(tmp_path / "credit_samples.jsonl")
    assert [r.step for r in records] == [1, 2]
    labels = {"entropy_top(mode=weight)", "random_top", "uniform"}
    for record in records:
        assert set(record.labels) == labels
        for s in record.samples:
            if s.advantage == 0:
                continue
            w = s.weights("entropy_top(mode=weight)")
            assert sum(w) / len(w) == pytest.approx(1.0, abs=1e-4)  # type: ignore[arg-type]
            assert set(s.weights("random_top")) <= {0.0, 1.0}  # type: ignore[arg-type]
