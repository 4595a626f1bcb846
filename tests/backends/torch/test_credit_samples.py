"""Credit samples in the native trainer: what a run records, where, and that it changes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends.common.errors import ConfigError
from backends.samples.records import SAMPLES_FILE, read_samples
from backends.torch.config import config_from_dict
from backends.torch.credit_samples import IMAGE_TAG
from backends.torch.trainer import GRPORecipe, train
from tests.helpers.torch_tiny import comparable, tiny_config

SAMPLED = {"credit": "datc", "steps": 4, "eval": {"interval": 2, "greedy": False}}


def _images(tb_dir: Path, tag: str) -> list[int]:
    """Steps at which TensorBoard holds an image under ``tag``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir), size_guidance={"images": 0})
    acc.Reload()
    return [e.step for e in acc.Images(tag)] if tag in acc.Tags()["images"] else []


def test_a_run_records_samples_at_its_evaluations_and_is_unchanged_by_them(
    tmp_path: Path,
) -> None:
    plain = train(tiny_config(tmp_path / "plain", **SAMPLED, credit_samples={"interval": 0}))
    assert not (tmp_path / "plain" / SAMPLES_FILE).exists()
    run = tmp_path / "run"
    cfg = tiny_config(
        run,
        **SAMPLED,
        credit_samples={"count": 3, "compare": ["uniform", "datc_mid"]},
        logging={"tensorboard": True},
    )
    result = train(cfg)
    # recording draws no random numbers and changes no weight: the same run
    assert [comparable(r) for r in result.history] == [comparable(r) for r in plain.history]
    assert [r["step"] for r in result.history if "time/credit_samples" in r] == [2, 4]

    records = read_samples(run / SAMPLES_FILE)
    assert [r.step for r in records] == [2, 4]
    for record in records:
        assert record.labels == ["datc", "uniform", "datc_mid"]
        assert len(record.samples) == 3
        advantages = [s.advantage for s in record.samples]
        assert advantages == sorted(advantages, reverse=True)
        assert advantages[0] > 0 > advantages[-1]  # both signs of one group
        for s in record.samples:
            assert 1 <= len(s.tokens) <= 6 and all(isinstance(t, str) for t in s.tokens)
            # GRPO's share is w = 1 at every token: the compared credit's A is the run's A
            assert s.weights("uniform") == pytest.approx([1.0] * len(s.tokens), abs=1e-5)
            for label in ("datc", "datc_mid"):  # DATC keeps the response's mean advantage
                w = s.weights(label)
                assert sum(w) / len(w) == pytest.approx(1.0, abs=1e-4)  # type: ignore[arg-type]
            assert s.weights("datc") != s.weights("datc_mid")
    assert _images(run / "tensorboard", IMAGE_TAG) == [2, 4]


def test_resume_drops_the_samples_recorded_after_the_checkpoint(tmp_path: Path) -> None:
    run = tmp_path / "run"
    cfg = tiny_config(
        run, steps=2, checkpoint={"interval": 2}, credit_samples={"interval": 1, "count": 2}
    )
    train(cfg)
    # a killed run recorded step 3 after its last checkpoint, and was cut mid-line
    with open(run / SAMPLES_FILE, "a") as fh:
        fh.write(json.dumps({"step": 3, "strategy": "uniform", "samples": []}) + "\n")
        fh.write('{"step": 4, "strat')
    train({**cfg, "steps": 3}, resume=True)
    records = read_samples(run / SAMPLES_FILE)
    assert [r.step for r in records] == [1, 2, 3]
    assert len(records[-1].samples) == 2  # step 3 recorded again, not the dead run's


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"compare": ["uniform", "uniform"]}, "credit_samples.compare.1: 'uniform' is already"),
        ({"compare": ["nope"]}, "credit_samples.compare.0: unknown credit strategy 'nope'"),
        ({"compare": "uniform"}, "credit_samples.compare: expected a list of strategies"),
        ({"count": 0}, "credit_samples.count"),
    ],
)
def test_a_bad_section_is_refused_naming_the_key(section: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        config_from_dict(tiny_config(Path("unused"), credit="datc", credit_samples=section))


def length_reward(prompts: list[str], responses: list[str]) -> list[float]:
    """A text scorer without a differentiable model."""
    return [float(len(r)) for r in responses]


def test_a_compared_strategy_needs_the_signals_the_run_can_compute(tmp_path: Path) -> None:
    (tmp_path / "train.jsonl").write_text(json.dumps({"prompt": "a b c"}) + "\n")
    cfg = tiny_config(tmp_path / "run", credit_samples={"compare": ["datc"]})
    cfg["data"] = {"train_file": str(tmp_path / "train.jsonl")}
    function = "tests.backends.torch.test_credit_samples:length_reward"
    cfg["reward"] = {"reward": {"kind": "callable", "function": function}}
    with pytest.raises(ConfigError, match=r"credit_samples.compare.0: strategy 'datc' needs"):
        GRPORecipe(config_from_dict(cfg))
