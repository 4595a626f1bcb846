"""``scripts/verl_gpu_smoke.sh`` cannot run without a GPU: here it parses, the overrides it
passes compose in verl's own Hydra config and pass ``credit-verl``'s checks (the credit
keys and verl's ``validate_config``), and its setup writes models and data that verl
reads; a typo would otherwise only show on the GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl", reason="the verl tests run in .venv-verl (make verl)")

from transformers import AutoTokenizer
from verl.trainer.ppo.utils import create_rl_dataset

from backends.verl.cli import checked_config, verl_overrides
from backends.verl.config import TRAINER_MODE, credit_settings
from tests.helpers.paths import REPO

SCRIPT = REPO / "scripts" / "verl_gpu_smoke.sh"
NAMES = ["VERL_COMMON", "VERL_UNIFORM", "VERL_DATC", "VERL_RED"]


def settings(work: str = "/work") -> dict[str, list[str]]:
    """The arrays of the script's SETTINGS block (``WORK=work``, ``ROLLOUT=vllm``)."""
    block = f"eval \"$(sed -n '/^# BEGIN SETTINGS/,/^# END SETTINGS/p' {SCRIPT})\"; " + "; ".join(
        f'printf "%s\\0" "${{{n}[@]}}"; printf "\\1"' for n in NAMES
    )
    env = {**os.environ, "WORK": work, "ROLLOUT": "vllm"}
    out = subprocess.run(["bash", "-c", block], capture_output=True, text=True, check=True, env=env)
    values = out.stdout.split("\1")[:-1]
    assert len(values) == len(NAMES), out.stdout
    return {n: v.split("\0")[:-1] for n, v in zip(NAMES, values, strict=True)}


def write_setup(work: Path) -> None:
    """Run the script's setup (its models, data and reward function, as written) into
    ``work``."""
    text = SCRIPT.read_text()
    start = text.index("\n", text.index("<<'PY'")) + 1
    setup = text[start : text.index("\nPY\n")]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-c", setup, str(work)], check=True, env=env, cwd=REPO)


def test_the_script_parses() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


@pytest.mark.parametrize(
    ("check", "strategy"),
    [("VERL_UNIFORM", "uniform"), ("VERL_DATC", "datc"), ("VERL_RED", "red")],
)
def test_the_checks_pass_settings_verl_and_the_backend_accept(check: str, strategy: str) -> None:
    found = settings()
    overrides = [*verl_overrides(found["VERL_COMMON"] + found[check])]
    config = checked_config([*overrides, f"trainer.v1.trainer_mode={TRAINER_MODE}"])
    assert credit_settings(config).plan.name == strategy


def test_the_setup_writes_models_and_data_verl_reads(tmp_path: Path) -> None:
    """The script's setup (run here as written) gives a policy with a chat template, a
    reward model, a reward function and a parquet file that verl's ``create_rl_dataset``
    reads, every prompt within ``data.max_prompt_length`` (verl refuses longer ones)."""
    write_setup(tmp_path)
    found = settings()
    config = checked_config(verl_overrides(found["VERL_COMMON"] + found["VERL_DATC"]))
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "policy")
    dataset = create_rl_dataset(
        [str(tmp_path / "data" / "train.parquet")], config.data, tokenizer, None
    )
    assert len(dataset) == 16
    for i in range(len(dataset)):
        prompt = tokenizer.apply_chat_template(
            dataset[i]["raw_prompt"], add_generation_prompt=True, tokenize=False
        )
        assert len(tokenizer(prompt)["input_ids"]) <= config.data.max_prompt_length
    reward = (tmp_path / "reward.py").read_text()
    assert "def compute_score(data_source, solution_str, ground_truth" in reward
