"""Third-party strategies through the entry-point group ``credit_core.strategies``.

Installing examples/credit_plugin_example makes ``position_decay`` appear in a fresh
process's ``list_strategies()``; an entry point that cannot be imported, or that offers a
class breaking the contract, is a CreditError naming the entry point and its distribution.
Entry points load once per process, so every scenario runs in a fresh process: one
interpreter imports credit_core (the registry is created lazily, on first use) and forks a
child per scenario, which puts that scenario's folder on sys.path and reports what the
public API does. pip builds the example offline with the venv's setuptools.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from credit_core import allocate_weights
from tests.helpers.paths import REPO

EXAMPLE = REPO / "examples" / "credit_plugin_example"


# argv: pairs of (scenario name, folder). Prints one JSON object {name: report}.
RUN_SCENARIOS = """
import json, os, sys
import torch
from credit_core import CreditBatch, CreditError, get_strategy, list_strategies, plugin_of


def report():
    errors = []  # every call that loads the entry points, twice: the error must persist
    for call in (list_strategies, lambda: get_strategy("datc"), lambda: plugin_of("uniform")):
        for _ in range(2):
            try:
                call()
                errors.append(None)
            except CreditError as exc:
                errors.append(str(exc))
    out = {"errors": errors}
    if errors[0] is None and "position_decay" in list_strategies():
        mask = torch.tensor([[True] * 6, [True, True, True, False, False, False]])
        batch = CreditBatch(torch.tensor([1.5, -0.5]), mask, torch.zeros(2, 6).long())
        strategy = get_strategy({"name": "position_decay", "half_life": 2.0, "beta": 1.5})
        out.update(
            names=list_strategies(),
            plugin=plugin_of("position_decay"),
            requires=sorted(strategy.requires),
            advantages=strategy.assign(batch).tolist(),
        )
    return out


results = {}
for name, folder in zip(sys.argv[1::2], sys.argv[2::2]):
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        sys.path.insert(0, folder)
        with os.fdopen(write_fd, "w") as pipe:
            pipe.write(json.dumps(report()))
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        results[name] = json.loads(pipe.read())
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, name
print(json.dumps(results))
"""

BROKEN = {
    # scenario: (distribution, entry point, module, module source, expected message)
    "raising": (
        "broken-credit-plugin",
        "broken",
        "broken_credit_plugin",
        'raise ImportError("needs a GPU")\n',
        r"failed to import: ImportError: needs a GPU",
    ),
    "bad_class": (
        "shouty-credit-plugin",
        "shouty",
        "shouty_credit_plugin",
        """
        from credit_core import hookimpl
        from credit_core.strategy import UniformStrategy

        class Shouty(UniformStrategy):
            name = "SHOUTY"

        @hookimpl
        def credit_core_strategies():
            return [Shouty]
        """,
        r"class attribute 'name' must be a lowercase identifier.*'SHOUTY'",
    ),
    "duplicate": (
        "copycat-credit-plugin",
        "copycat",
        "copycat_credit_plugin",
        """
        from credit_core import hookimpl
        from credit_core.strategy import UniformStrategy

        class Copycat(UniformStrategy):
            name = "datc"

        @hookimpl
        def credit_core_strategies():
            return [Copycat]
        """,
        r"strategy name 'datc' is already registered by plugin 'credit_core.builtin'",
    ),
}


def _fake_distribution(root: Path, dist: str, entry_point: str, module: str, source: str) -> None:
    """An installed-looking distribution: a .dist-info with one entry point, and its module."""
    info = root / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[credit_core.strategies]\n{entry_point} = {module}\n")
    (root / f"{module}.py").write_text(textwrap.dedent(source))


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, object]]:
    """What a fresh process reports with each scenario's folder on its path."""
    tmp = tmp_path_factory.mktemp("plugins")
    source = tmp / "src"  # build from a copy: no build/ or egg-info in the repository
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    installed = tmp / "site"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index"]
    pip += ["--no-build-isolation", "--target", str(installed), str(source)]
    done = subprocess.run(pip, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    folders = {"example": installed, "nothing": tmp / "empty"}
    folders["nothing"].mkdir()
    for name, (dist, entry_point, module, code, _) in BROKEN.items():
        folders[name] = tmp / name
        _fake_distribution(folders[name], dist, entry_point, module, code)
    argv = [str(x) for name, folder in folders.items() for x in (name, folder)]
    done = subprocess.run(
        [sys.executable, "-c", RUN_SCENARIOS, *argv], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, dict[str, object]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.slow
def test_installed_example_plugin_registers_its_strategy(
    reports: dict[str, dict[str, object]],
) -> None:
    report = reports["example"]
    assert report["errors"] == [None] * 6
    assert "position_decay" in report["names"]  # type: ignore[operator]
    assert {"datc", "uniform"} <= set(report["names"])  # type: ignore[arg-type]
    assert report["plugin"] == "entrypoint:position_decay"
    assert report["requires"] == []
    # Expected: A * w with the shared allocation of the scores 2^(-k/2), k = 0, 1, ...
    mask = torch.tensor([[True] * 6, [True, True, True, False, False, False]])
    scores = torch.exp2(-torch.arange(6.0) / 2.0).expand(2, 6)
    w, _ = allocate_weights(scores, mask, beta=1.5, lam=0.5, on_nonfinite="error")
    expected = (torch.tensor([1.5, -0.5]).double().unsqueeze(1) * w).float()
    torch.testing.assert_close(torch.tensor(report["advantages"]), expected)
    assert expected[0, 0] > expected[0, 5] > 0  # early tokens get more credit


@pytest.mark.slow
def test_without_the_plugin_the_strategy_is_absent(reports: dict[str, dict[str, object]]) -> None:
    assert reports["nothing"] == {"errors": [None] * 6}


@pytest.mark.slow
@pytest.mark.parametrize("scenario", sorted(BROKEN))
def test_broken_entry_points_are_errors_naming_them(
    reports: dict[str, dict[str, object]], scenario: str
) -> None:
    dist, entry_point, module, _, expected = BROKEN[scenario]
    messages = reports[scenario]["errors"]
    assert isinstance(messages, list) and len(messages) == 6
    assert all(m == messages[0] for m in messages), "the same error on every lookup"
    message = messages[0]
    assert f"entry point '{entry_point}' = '{module}'" in message, message
    assert f"distribution '{dist}'" in message and "'credit_core.strategies'" in message, message
    assert re.search(expected, message), message
