"""``credit-verl`` keeps the project's error contract: an expected failure (a bad credit
key, a strategy the backend cannot serve, a Hydra override verl's config refuses, a config
verl's own ``validate_config`` refuses) is one message naming the key, exit status 2, no
traceback, before verl starts Ray."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("verl", reason="the verl tests run in .venv-verl (make verl)")

from backends.verl.cli import PROG, main
from tests.helpers.paths import REPO


def assert_one_message(status: int, err: str, *fragments: str) -> None:
    assert status == 2, err
    assert err.startswith(f"{PROG}: error: "), err
    assert all(line.startswith(f"{PROG}: ") for line in err.splitlines()), err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, err


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (
            ["algorithm.adv_estimator=grpo", "algorithm.credit=saliency"],
            ["algorithm.credit: strategy 'saliency' is not served", "reward_grad"],
        ),
        (
            ["algorithm.adv_estimator=grpo", "algorithm.credit={name:datc,betta:1}"],
            ["algorithm.credit:", "unknown parameter 'betta'"],
        ),
        (["algorithm.adv_estimator=grpo", "algorithm.credit=datc"], ["algorithm.direction:"]),
        (
            ["algorithm.credit_chunk=3"],
            ["verl config: Could not override 'algorithm.credit_chunk'"],
        ),
        (
            ["algorithm.adv_estimator=grpo", "algorithm.credit=uniform"],
            ["verl config:", "ppo_micro_batch_size"],
        ),
    ],
)
def test_expected_failures_are_one_message(
    args: list[str], fragments: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(args)
    assert_one_message(status, capsys.readouterr().err, *fragments)


def test_debug_shows_the_traceback() -> None:
    from credit_core import CreditError

    with pytest.raises(CreditError, match="not served"):
        main(["--debug", "algorithm.adv_estimator=grpo", "algorithm.credit=saliency"])


def test_python_dash_m_is_the_same_command() -> None:
    # the test-only CPU platform announces itself at verl's INFO level
    env = {**os.environ, "VERL_LOGGING_LEVEL": "WARNING"}
    done = subprocess.run(
        [sys.executable, "-m", "backends.verl", "algorithm.credit=saliency"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert_one_message(done.returncode, done.stderr, "'saliency' is not served")
