"""The README's code runs as written.

- The API block (the ```python block that calls ``assign_credit``) runs with the inputs it
  names but does not define (``rewards, hidden, lm_head, tokens, rm_embedding, mask, g``: a
  batch of two groups of responses with a real ``nn.Linear`` LM head), once with the hidden
  states in the autograd graph (as they are inside a training step) and once without.
- The TRL quickstart (the ```python block that imports ``backends.trl``) trains with what a
  TRL user already has (``model, tokenizer, reward, dataset``) and a ``direction`` model:
  a tiny policy and the built-in positional task.
- The strategies x backends table is the one ``backends.common.support`` computes from the
  backends' own plans.
- Every command of a ```bash block either runs, in README order, or is listed in ``SKIPPED``
  with the reason. The commands run unchanged in a scratch folder that holds the
  repository's ``configs/`` and a ``.venv/bin`` that is the running interpreter's; so
  ``runs/...`` folders land in the scratch folder, and the project imported is this
  checkout (``PYTHONPATH``).
- The demo's duration is stated once, the same way, in the README, the Makefile and the
  quick ablation config.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from credit_core import CreditResult
from tests.helpers.paths import REPO

README = (REPO / "README.md").read_text()

#: README commands that the tests do not run, by how they start, with the reason.
SKIPPED = {
    "make demo": "builds .venv and runs the quick ablation (minutes); tests/ablations runs "
    "the same runner on tiny settings",
    "make test": "the whole test suite, which includes this test",
    ".venv/bin/credit-ablate configs/ablate/quick.yaml": "what `make demo` runs (minutes)",
    ".venv/bin/credit-trl --config configs/trl/tiny_datc.yaml": "80 TRL steps (about a "
    "minute); tests/backends/trl runs the same CLI end to end on fewer steps",
    ".venv/bin/credit-ablate configs/ablate/credit_variants.yaml": "the probe study behind "
    "docs/results/credit_variants (48 runs, tens of minutes)",
    ".venv/bin/credit-ablate configs/ablate/full.yaml": "the full comparison (hours; shards "
    "meant for two machines)",
    ".venv/bin/credit-ablate merge": "merges the output folders of the full run's shards",
    "credit-openrlhf": "OpenRLHF on 8 GPUs with Ray and vLLM",
    "credit-verl": "verl's main_ppo on GPUs with Ray and vLLM, in .venv-verl",
    ".venv/bin/credit-train configs/torch/smollm2_datc.yaml": "SmolLM2-135M for 4 steps "
    "(minutes on CPU); tests/backends/torch/test_smollm2.py trains the same config's shape",
    ".venv/bin/credit-trl --config configs/trl/smollm2_datc.yaml": "the same under TRL; "
    "tests/backends/trl/test_smollm2.py runs a step of it",
    "pip install": "installs into the environment that runs the tests (make install does)",
}


def blocks(language: str) -> list[str]:
    """The text of every fenced ``language`` block of the README, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```", README, flags=re.MULTILINE | re.DOTALL)


def commands(block: str) -> list[str]:
    """The commands of a shell block: continuation lines joined, comments dropped."""
    joined = block.replace("\\\n", " ")
    return [" ".join(shlex.split(line, comments=True)) for line in joined.splitlines()]


def skip_reason(command: str) -> str | None:
    return next((why for start, why in SKIPPED.items() if command.startswith(start)), None)


# ------------------------------------------------------------------------------- Python


def api_inputs(requires_grad: bool) -> dict[str, Any]:
    """The snippet's free variables: 2 prompts x 8 responses of up to 6 tokens, H = 12,
    vocabulary 40, reward-model embedding width 5."""
    gen = torch.Generator().manual_seed(0)
    B, T, H, V, d = 16, 6, 12, 40, 5
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    hidden = torch.randn(B, T, H, generator=gen)
    lm_head = torch.nn.Linear(H, V, bias=False)
    return {
        "rewards": torch.randn(B, generator=gen),
        "hidden": hidden.requires_grad_(requires_grad),
        "lm_head": lm_head.requires_grad_(requires_grad),
        "tokens": torch.randint(0, V, (B, T), generator=gen),
        "rm_embedding": torch.randn(V, d, generator=gen),
        "mask": torch.arange(T) < lengths.unsqueeze(1),
        "g": torch.randn(B, T, d, generator=gen),
    }


def python_block(marker: str) -> str:
    """The one ```python block of the README that contains ``marker``."""
    [block] = [b for b in blocks("python") if marker in b]
    return block


def test_every_python_block_is_run_by_a_test() -> None:
    assert len(blocks("python")) == 3  # the TRL quickstart, the step rewards, the API block


def test_the_step_reward_function_trains_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's reward function, as the module ``my_rules`` its YAML line names, trains
    the native trainer's ``process`` for a step: below the group's mean, the first step's
    reward lowers the advantage of the first half of each response (docs/design.md,
    "User-given token rewards")."""
    from backends.torch.config import config_from_dict
    from backends.torch.credit import CreditPath
    from backends.torch.trainer import train
    from tests.helpers.torch_tiny import tiny_config

    block = python_block("def step_reward(")
    for line in (
        "reward: {reward: {kind: callable, function: my_rules:step_reward}}",
        "credit: {name: process, outcome_weight: 0.5}",
    ):
        assert line in README
    (tmp_path / "my_rules.py").write_text(block)
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    real = CreditPath.signals

    def spy(self: CreditPath, *args: Any, **kwargs: Any) -> Any:
        seen.append(real(self, *args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(CreditPath, "signals", spy)
    cfg = tiny_config(
        tmp_path / "run",
        steps=1,
        credit={"name": "process", "outcome_weight": 0.5},
        reward={"reward": {"kind": "callable", "function": "my_rules:step_reward"}},
    )
    train(config_from_dict(cfg))
    mask = seen[0].batch.response_mask.bool()
    token_adv = seen[0].credit.token_advantages
    for row, valid in zip(token_adv, mask, strict=True):
        a = row[valid]
        assert torch.isfinite(a).all()
        if len(a) >= 2:
            assert a[-1] > a[0]


def test_the_api_block_uses_the_inputs_provided() -> None:
    api = python_block("assign_credit(")
    for name in api_inputs(False):
        assert re.search(rf"\b{name}\b", api), name


@pytest.mark.parametrize("requires_grad", [False, True], ids=["no-grad", "grad"])
def test_the_api_block_runs(requires_grad: bool) -> None:
    for block in [python_block("assign_credit(")]:
        namespace = api_inputs(requires_grad)
        exec(compile(block, "README.md (python block)", "exec"), namespace)
        mask: torch.Tensor = namespace["mask"]
        token_adv: torch.Tensor = namespace["token_adv"]
        assert token_adv.shape == mask.shape and token_adv.dtype == torch.float32
        assert (token_adv[~mask] == 0).all() and torch.isfinite(token_adv).all()
        assert not namespace["stats"].m1.requires_grad
        assert namespace["strategy"].requires == {"reward_grad", "policy_stats"}
        # the streamed W0 gives the same credit as PolicyStats + the reward gradient
        assert not namespace["w0"].requires_grad
        same: CreditResult = namespace["same"]
        torch.testing.assert_close(same.token_advantages, token_adv, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_the_trl_quickstart_trains(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.helpers.openrlhf_stubs import stubs_hidden

    with stubs_hidden():  # TRL probes for vllm at import; the OpenRLHF tests stub it
        pytest.importorskip("trl.trainer.grpo_trainer")
        from backends.trl.tasks import PolicyPreset, task_data, tiny_policy

        model, tokenizer = tiny_policy(PolicyPreset())
        task = task_data(
            "positional", {"positions": [2, 9, 17]}, len(tokenizer), tokenizer, torch.device("cpu")
        )
        namespace: dict[str, Any] = {
            "model": model,
            "tokenizer": tokenizer,
            "reward": task.reward,
            "dataset": task.train,
            "direction": task.direction,
        }
        monkeypatch.chdir(tmp_path)
        block = python_block("backends.trl")
        exec(compile(block, "README.md (TRL quickstart)", "exec"), namespace)
    trainer = namespace["trainer"]
    assert trainer.state.global_step == 2
    assert trainer.args.credit_plan.name == "datc"


# ------------------------------------------------------------------------------ support


def test_the_support_table_is_the_backends_plans() -> None:
    from backends.common.support import support_markdown, support_rows

    assert support_markdown(support_rows()) in README


def test_the_first_screen_holds_the_install_the_quickstarts_and_the_support_table() -> None:
    first = "\n".join(README.splitlines()[:60])
    for needed in (
        "pip install",
        "make demo",
        "make test",
        "credit-train",
        "backends.trl",
        "credit-openrlhf --credit datc",
        "algorithm.credit=datc",
        "| strategy |",
    ):
        assert needed in first, needed


# -------------------------------------------------------------------------------- shell


def test_every_shell_command_runs_or_is_skipped_with_a_reason() -> None:
    listed = [c for block in blocks("bash") for c in commands(block) if c]
    assert listed, "the README has no shell commands"
    for start in SKIPPED:
        assert any(c.startswith(start) for c in listed), f"SKIPPED names no command: {start}"
    torchrun = [c for c in listed if "torchrun" in c]
    assert torchrun and all(c.startswith(".venv/bin/torchrun ") for c in torchrun)


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    """A folder where README commands run as in the repository (see the module docstring)."""
    (tmp_path / "configs").symlink_to(REPO / "configs")
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "bin").symlink_to(Path(sys.executable).parent)
    return tmp_path


@pytest.mark.slow
def test_the_shell_commands_run(scratch: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    ran = []
    for block in blocks("bash"):
        for command in commands(block):
            if not command or skip_reason(command):
                continue
            done = subprocess.run(
                ["bash", "-c", command],
                cwd=scratch,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}{done.stderr[-4000:]}"
            ran.append(command)
    assert len(ran) == 5  # the four credit-train lines and credit-view
    for run in ("tiny_datc", "tiny_uniform", "ddp"):
        assert (scratch / "runs" / run / "metrics.jsonl").is_file(), run
    assert (scratch / "runs" / "tiny_datc" / "credit_view.html").is_file()


# --------------------------------------------------------------------------- demo time


def test_the_demo_time_is_stated_once_the_same_way() -> None:
    """README, Makefile and configs/ablate/quick.yaml give the same duration of the demo."""
    pattern = r"[Aa]bout (\d+) minutes on 2 cores"
    sources = {
        "README.md": README,
        "Makefile": (REPO / "Makefile").read_text(),
        "configs/ablate/quick.yaml": (REPO / "configs" / "ablate" / "quick.yaml").read_text(),
    }
    stated = {name: re.findall(pattern, text) for name, text in sources.items()}
    assert all(len(found) == 1 for found in stated.values()), stated
    assert len({found[0] for found in stated.values()}) == 1, stated
    for name, text in sources.items():
        assert not re.search(r"\d+ min(?:utes)? \d+ s|~\d+ min", text), name
