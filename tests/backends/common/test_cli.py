"""``run_cli``: an expected failure is one message and exit status 2; a bug keeps its
traceback; ``--debug`` shows the traceback of an expected failure too."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from backends.common.cli import CommandError, run_cli
from credit_core import CreditError


def failing(exc: Exception) -> Callable[[list[str]], int]:
    def main(args: list[str]) -> int:
        raise exc

    return main


@pytest.mark.parametrize(
    ("exc", "message"),
    [
        (CreditError("CreditBatch.mask: expected bool"), "CreditBatch.mask: expected bool"),
        (CommandError("--device cuda: no GPU"), "--device cuda: no GPU"),
        (
            FileNotFoundError(2, "No such file or directory", "data/train.jsonl"),
            "no such file or directory: 'data/train.jsonl'; check the path",
        ),
        (
            PermissionError(13, "Permission denied", "/runs/x"),
            "permission denied: '/runs/x'; make it accessible or choose another path",
        ),
        (OSError(28, "No space left on device", "/runs/x"), "No space left on device: '/runs/x'"),
        (
            ModuleNotFoundError("No module named 'flash_attn'", name="flash_attn"),
            "the Python module 'flash_attn' is not installed (No module named 'flash_attn'); "
            "install the package",
        ),
        (ImportError("cannot import name 'X' from 'vllm'", name="vllm"), "cannot import vllm"),
    ],
)
def test_expected_failures_are_one_message_and_status_2(
    exc: Exception, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli("credit-x", failing(exc), ["a"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"credit-x: error: {message}")
    assert all(line.startswith("credit-x: ") for line in err.splitlines())
    assert "Traceback" not in err and "--debug" in err


def test_a_command_adds_its_own_expected_type(capsys: pytest.CaptureFixture[str]) -> None:
    class ConfigError(ValueError):
        pass

    assert run_cli("p", failing(ConfigError("bad key")), [], expected=(ConfigError,)) == 2
    assert capsys.readouterr().err.startswith("p: error: bad key")
    with pytest.raises(ValueError, match="a bug"):
        run_cli("p", failing(ValueError("a bug")), [], expected=(ConfigError,))


def test_bugs_raise() -> None:
    with pytest.raises(KeyError):
        run_cli("p", failing(KeyError("x")), [])


def test_debug_shows_the_traceback_and_is_not_passed_on() -> None:
    with pytest.raises(CreditError, match="bad"):
        run_cli("p", failing(CreditError("bad")), ["x", "--debug"])
    seen: list[list[str]] = []

    def main(args: list[str]) -> int:
        seen.append(args)
        return 7

    assert run_cli("p", main, ["x", "--debug", "y"]) == 7
    assert seen == [["x", "y"]]
