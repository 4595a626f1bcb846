"""``scripts/gpu_smoke.sh`` cannot run without a GPU: here it parses, its configs exist, and
the settings it passes are ones the trainers accept (a typo would only show on the GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from backends.torch.config import TrainConfig, load_config
from tests.helpers.paths import REPO

SCRIPT = REPO / "scripts" / "gpu_smoke.sh"
OPENRLHF_SCRIPT = REPO / "scripts" / "openrlhf_gpu_smoke.sh"


def bash_arrays(script: Path, names: list[str]) -> dict[str, list[str]]:
    """The variables ``names`` of ``script``'s SETTINGS block, each as its list of words (as
    bash expands them)."""
    block = f"eval \"$(sed -n '/^# BEGIN SETTINGS/,/^# END SETTINGS/p' {script})\"; " + "; ".join(
        f'printf "%s\\0" "${{{n}[@]}}"; printf "\\1"' for n in names
    )
    out = subprocess.run(["bash", "-c", block], capture_output=True, text=True, check=True)
    values = out.stdout.split("\1")[:-1]
    assert len(values) == len(names), out.stdout
    return {n: v.split("\0")[:-1] for n, v in zip(names, values, strict=True)}


def settings() -> dict[str, list[str]]:
    """The variables of gpu_smoke.sh's SETTINGS block."""
    names = ["NATIVE_CONFIG", "TRL_CONFIG", "NATIVE_GPU", "NATIVE_FSDP_VLLM", "NATIVE_DATC_MID"]
    return bash_arrays(SCRIPT, names)


@pytest.mark.parametrize("script", ["gpu_smoke.sh", "openrlhf_gpu_smoke.sh"])
def test_the_gpu_smoke_scripts_parse(script: str) -> None:
    subprocess.run(["bash", "-n", str(REPO / "scripts" / script)], check=True)


def overrides(words: list[str]) -> list[str]:
    assert words[::2] == ["--set"] * (len(words) // 2), words
    return words[1::2]


@pytest.mark.parametrize("check", ["NATIVE_FSDP_VLLM", "NATIVE_DATC_MID"])
def test_the_native_checks_pass_settings_the_trainer_accepts(check: str, tmp_path: Path) -> None:
    s = settings()
    (config,) = s["NATIVE_CONFIG"]
    sets = [*overrides(s["NATIVE_GPU"]), *overrides(s[check]), f"output_dir={tmp_path}"]
    cfg = load_config(REPO / config, sets)
    assert isinstance(cfg, TrainConfig)
    assert (cfg.device, cfg.distributed.backend, cfg.policy.dtype) == ("cuda", "nccl", "bfloat16")
    if check == "NATIVE_FSDP_VLLM":
        assert (cfg.distributed.strategy, cfg.rollout.engine) == ("fsdp", "vllm")
        assert cfg.checkpoint.interval > 0
    else:
        assert cfg.credit.name == "datc_mid" and cfg.distributed.strategy == "ddp"


def test_the_trl_check_passes_a_config_trl_accepts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import transformers.training_args

    from backends.trl.cli import make_parser

    # bf16 is checked against the GPU when the arguments are built: pretend one is there
    monkeypatch.setattr(transformers.training_args, "is_torch_bf16_gpu_available", lambda: True)

    (config,) = settings()["TRL_CONFIG"]
    args = ["--config", str(REPO / config), "--output_dir", str(tmp_path)]
    args += ["--model_name_or_path", "P", "--reward_model_name_or_path", "R"]
    args += ["--dataset_name", "D", "--credit", "datc_mid"]
    script, training, model, _ = make_parser().parse_args_and_config(args)
    assert script.reward_model_name_or_path == "R" and model.model_name_or_path == "P"
    assert training.credit_config.name == "datc_mid" and training.bf16


def test_the_packed_openrlhf_run_passes_settings_openrlhf_and_the_credit_accept() -> None:
    """``openrlhf_packed_datc_mid``: gpu_smoke.sh runs openrlhf_gpu_smoke.sh's
    ``datc_mid_packed`` run alone; its PACKED flags parse in OpenRLHF and the credit serves
    datc_mid with them (packing is no longer refused)."""
    from backends.openrlhf.compat import resolve_credit
    from backends.openrlhf.settings import OpenRLHFCreditConfig
    from credit_core import CreditConfig
    from tests.helpers.openrlhf import openrlhf_args

    packed = bash_arrays(OPENRLHF_SCRIPT, ["PACKED"])["PACKED"]
    assert "--ds.packing_samples" in packed and "--train.dynamic_batch_enable" in packed
    text = OPENRLHF_SCRIPT.read_text()
    assert (
        'run datc_mid_packed --credit datc_mid --credit.beta 1.0 --credit.lam 0.5 "${PACKED[@]}"'
        in text
    )
    assert "RUNS=datc_mid_packed" in SCRIPT.read_text()
    args = openrlhf_args(
        [
            "--algo.advantage.estimator",
            "group_norm",
            "--algo.kl.use_loss",
            "--reward.model_name_or_path",
            "/models/rm",
            *packed,
        ]
    )
    assert args.ds.packing_samples and args.train.dynamic_batch_enable
    assert args.ds.attn_implementation == "flash_attention_2"
    credit = resolve_credit(args, OpenRLHFCreditConfig(credit=CreditConfig.parse("datc_mid")))
    assert credit.requires == {"policy_stats", "reward_grad"} and credit.placement == "reward"


def test_the_ppo_gae_openrlhf_run_passes_settings_openrlhf_and_the_credit_accept() -> None:
    """``openrlhf_ppo_gae_abc``: gpu_smoke.sh runs openrlhf_gpu_smoke.sh's ``ppo_gae_abc``
    run alone; its PPO_GAE flags, with the script's COMMON ones, parse in OpenRLHF (which
    then takes the critic from the reward model's folder) and the credit serves ABC's paper
    form under ``gae``."""
    from backends.openrlhf.compat import resolve_credit
    from backends.openrlhf.settings import OpenRLHFCreditConfig
    from credit_core import CreditConfig
    from tests.helpers.openrlhf import openrlhf_args

    ppo_gae = bash_arrays(OPENRLHF_SCRIPT, ["PPO_GAE"])["PPO_GAE"]
    text = OPENRLHF_SCRIPT.read_text()
    assert 'run ppo_gae_abc --credit abc --credit.mode paper "${PPO_GAE[@]}"' in text
    assert "RUNS=ppo_gae_abc" in SCRIPT.read_text()
    assert "wanted openrlhf_ppo_gae_abc" in SCRIPT.read_text()
    common = [  # the script's COMMON flags that the credit reads
        "--reward.model_name_or_path",
        "/models/rm",
        "--algo.advantage.estimator",
        "group_norm",
        "--algo.kl.use_loss",
        "--rollout.n_samples_per_prompt",
        "4",
    ]
    args = openrlhf_args([*common, *ppo_gae])  # later flags win, as in the script
    assert args.algo.advantage.estimator == "gae"
    assert (args.critic.num_nodes, args.critic.num_gpus_per_node) == (1, 1)
    cfg = OpenRLHFCreditConfig(credit=CreditConfig.parse({"name": "abc", "mode": "paper"}))
    credit = resolve_credit(args, cfg)
    assert credit.requires == {"reward_attention"} and credit.placement == "reward"
    assert credit.plan.strategy.critic_reward_form == "token_rewards"


def test_the_zero3_openrlhf_run_takes_the_one_reward_model_pass() -> None:
    """``openrlhf_zero3_one_pass_datc``: gpu_smoke.sh runs openrlhf_gpu_smoke.sh's
    ``datc_zero3`` run alone; its ZERO3 flags parse in OpenRLHF (stage 3) and, with the
    script's common flags, the credit serves datc on the one-pass path."""
    from backends.openrlhf.compat import resolve_credit
    from backends.openrlhf.settings import OpenRLHFCreditConfig
    from credit_core import CreditConfig
    from tests.helpers.openrlhf import openrlhf_args

    zero3 = bash_arrays(OPENRLHF_SCRIPT, ["ZERO3"])["ZERO3"]
    text = OPENRLHF_SCRIPT.read_text()
    assert 'run datc_zero3 --credit datc --credit.beta 1.0 --credit.lam 0.5 "${ZERO3[@]}"' in text
    assert "RUNS=datc_zero3" in SCRIPT.read_text()
    assert "result openrlhf_zero3_one_pass_datc" in SCRIPT.read_text()
    base = ["--algo.advantage.estimator", "group_norm", "--algo.kl.use_loss"]
    args = openrlhf_args([*base, "--reward.model_name_or_path", "/models/rm", *zero3])
    assert args.ds.zero_stage == 3
    credit = resolve_credit(args, OpenRLHFCreditConfig(credit=CreditConfig.parse("datc")))
    assert credit.one_pass and credit.placement == "reward"


# ------------------------------------------------------------------ dry runs with a stub python
STUB = """\
import json, os, sys
args = sys.argv[1:]
stdin = sys.stdin.read() if args[:1] == ["-"] else ""
with open(os.environ["STUB_LOG"], "a") as log:
    log.write(json.dumps({"argv": args, "stdin": stdin}) + "\\n")
if args[:1] == ["-c"] and "find_spec" in args[1]:  # the scripts' module probe
    missing = os.environ.get("STUB_MISSING", "").split()
    print(" ".join(m for m in args[2:] if m in missing))
fail = os.environ.get("STUB_FAIL")
sys.exit(1 if fail and any(fail in a for a in args) else 0)
"""


def dry_run(
    script: Path, tmp_path: Path, env: dict[str, str], args: tuple[str, ...] = ()
) -> tuple[subprocess.CompletedProcess[str], list[list[str]]]:
    """Run ``script`` with ``PYTHON`` a stub that records each call's argv (and a heredoc's
    text) and exits 0 (1 where an argument contains ``STUB_FAIL``), and ``nvidia-smi`` a
    stub: the script's exit status and output, and the argv of every python call in order."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    python = bin_dir / "stub-python"
    python.write_text(f"#!{sys.executable}\n{STUB}")
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'Stub GPU, 80 GiB'\n")
    for stub in (python, smi):
        stub.chmod(0o755)
    log = tmp_path / "calls.jsonl"
    full_env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "PYTHON": str(python),
        "WORK": str(tmp_path / "work"),
        "STUB_LOG": str(log),
        **env,
    }
    done = subprocess.run(
        ["bash", str(script), *args], capture_output=True, text=True, env=full_env, timeout=60
    )
    lines = log.read_text().splitlines() if log.exists() else []
    return done, [json.loads(line)["argv"] for line in lines]


def test_the_openrlhf_scripts_trl_section_runs_its_three_trl_runs(tmp_path: Path) -> None:
    """``TRL_ONLY=1``: the section reaches its three ``accelerate launch`` runs (uniform,
    datc, datc with LoRA) under the ZeRO-3 config and its metric check, and ends with 0
    (a stray line there once made it exit 127 before anything ran)."""
    done, calls = dry_run(OPENRLHF_SCRIPT, tmp_path, {"TRL_ONLY": "1", "BENCH": "0"})
    assert done.returncode == 0, done.stdout + done.stderr
    launches = [c for c in calls if c[:2] == ["-m", "accelerate.commands.launch"]]
    assert len(launches) == 3, calls
    for argv in launches:
        assert argv[2:4] == ["--config_file", str(REPO / "configs/trl/accelerate_zero3_1gpu.yaml")]
        assert argv[4:8] == ["-m", "backends.trl", "--config", f"{tmp_path}/work/trl.yaml"]
    credits = [a[a.index("--credit") + 1] for a in launches]
    assert credits == ["uniform", '{"name": "datc", "beta": 1.0, "lam": 0.5}', "datc"]
    assert launches[2][-5:] == ["--use_peft", "true", "--lora_target_modules", "q_proj", "v_proj"]
    trl_yaml = (tmp_path / "work" / "trl.yaml").read_text()
    assert "task: positional" in trl_yaml and "bf16: true" in trl_yaml
    assert "TRL: checking the logged credit diagnostics" in done.stdout
