"""``scripts/verl_gpu_smoke.sh`` cannot run without a GPU: here it parses and the overrides
it passes compose in verl's own Hydra config and pass ``credit-verl``'s checks (the credit
keys and verl's ``validate_config``); a typo would otherwise only show on the GPU."""

from __future__ import annotations

import os
import subprocess

import pytest

pytest.importorskip("verl", reason="the verl tests run in .venv-verl (make verl)")

from backends.verl.cli import checked_config, verl_overrides
from backends.verl.config import TRAINER_MODE, credit_settings
from tests.helpers.paths import REPO

SCRIPT = REPO / "scripts" / "verl_gpu_smoke.sh"
NAMES = ["VERL_COMMON", "VERL_UNIFORM", "VERL_DATC"]


def settings() -> dict[str, list[str]]:
    """The arrays of the script's SETTINGS block (``WORK=/work``, ``ROLLOUT=vllm``)."""
    block = f"eval \"$(sed -n '/^# BEGIN SETTINGS/,/^# END SETTINGS/p' {SCRIPT})\"; " + "; ".join(
        f'printf "%s\\0" "${{{n}[@]}}"; printf "\\1"' for n in NAMES
    )
    env = {**os.environ, "WORK": "/work", "ROLLOUT": "vllm"}
    out = subprocess.run(["bash", "-c", block], capture_output=True, text=True, check=True, env=env)
    values = out.stdout.split("\1")[:-1]
    assert len(values) == len(NAMES), out.stdout
    return {n: v.split("\0")[:-1] for n, v in zip(NAMES, values, strict=True)}


def test_the_script_parses() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


@pytest.mark.parametrize(
    ("check", "strategy"), [("VERL_UNIFORM", "uniform"), ("VERL_DATC", "datc")]
)
def test_the_checks_pass_settings_verl_and_the_backend_accept(check: str, strategy: str) -> None:
    found = settings()
    overrides = [*verl_overrides(found["VERL_COMMON"] + found[check])]
    config = checked_config([*overrides, f"trainer.v1.trainer_mode={TRAINER_MODE}"])
    assert credit_settings(config).credit.name == strategy
