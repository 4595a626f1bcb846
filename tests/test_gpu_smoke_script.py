"""``scripts/gpu_smoke.sh`` cannot run without a GPU: here it parses, its configs exist, the
settings it passes are ones the trainers accept (a typo would only show on the GPU), and dry
runs with a stub python (each call's argv recorded) check the command lines it runs, the
checks it skips and why, and its PASS/FAIL lines: in full mode, in the bare-image mode
(``--bare-image``: the wheelhouse installed with ``pip --no-index --target``), and those of
``openrlhf_gpu_smoke.sh``'s TRL section, ``verl_gpu_smoke.sh``'s preflight and
``wheelhouse.sh`` (``make wheelhouse``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from backends.torch.config import TrainConfig, load_config
from tests.helpers.paths import REPO

SCRIPT = REPO / "scripts" / "gpu_smoke.sh"
OPENRLHF_SCRIPT = REPO / "scripts" / "openrlhf_gpu_smoke.sh"


def bash_arrays(script: Path, names: list[str], work: Path | str = "/work") -> dict[str, list[str]]:
    """The variables ``names`` of ``script``'s SETTINGS block, each as its list of words (as
    bash expands them, with ``WORK=work``)."""
    block = f"eval \"$(sed -n '/^# BEGIN SETTINGS/,/^# END SETTINGS/p' {script})\"; " + "; ".join(
        f'printf "%s\\0" "${{{n}[@]}}"; printf "\\1"' for n in names
    )
    env = {**os.environ, "WORK": str(work)}
    out = subprocess.run(["bash", "-c", block], capture_output=True, text=True, check=True, env=env)
    values = out.stdout.split("\1")[:-1]
    assert len(values) == len(names), out.stdout
    return {n: v.split("\0")[:-1] for n, v in zip(names, values, strict=True)}


def settings(work: Path | str = "/work") -> dict[str, list[str]]:
    """The variables of gpu_smoke.sh's SETTINGS block (with ``WORK=work``)."""
    names = ["NATIVE_CONFIG", "TRL_CONFIG", "NATIVE_GPU", "NATIVE_FSDP_VLLM", "NATIVE_WORK_MODELS"]
    names += ["NATIVE_DATC", "NATIVE_DATC_MID", "BARE_CHECKS"]
    return bash_arrays(SCRIPT, names, work)


@pytest.mark.parametrize(
    "script", ["gpu_smoke.sh", "openrlhf_gpu_smoke.sh", "verl_gpu_smoke.sh", "wheelhouse.sh"]
)
def test_the_gpu_smoke_scripts_parse(script: str) -> None:
    subprocess.run(["bash", "-n", str(REPO / "scripts" / script)], check=True)


def overrides(words: list[str]) -> list[str]:
    assert words[::2] == ["--set"] * (len(words) // 2), words
    return words[1::2]


def work_models(work: Path) -> None:
    """What the script's setup writes in ``work`` and the native config checks exist: the
    policy's config.json, the reward model's folder and the prompts."""
    (work / "policy").mkdir(parents=True)
    (work / "policy" / "config.json").write_text("{}")
    (work / "rm").mkdir()
    (work / "prompts").mkdir()
    (work / "prompts" / "train.jsonl").write_text('{"prompt": "Write about the cat:"}\n')


@pytest.mark.parametrize("check", ["NATIVE_FSDP_VLLM", "NATIVE_DATC", "NATIVE_DATC_MID"])
def test_the_native_checks_pass_settings_the_trainer_accepts(check: str, tmp_path: Path) -> None:
    s = settings(tmp_path)
    work_models(tmp_path)
    (config,) = s["NATIVE_CONFIG"]
    models = [] if check == "NATIVE_FSDP_VLLM" else overrides(s["NATIVE_WORK_MODELS"])
    sets = [*overrides(s["NATIVE_GPU"]), *models, *overrides(s[check]), f"output_dir={tmp_path}"]
    cfg = load_config(REPO / config, sets)
    assert isinstance(cfg, TrainConfig)
    assert (cfg.device, cfg.distributed.backend, cfg.policy.dtype) == ("cuda", "nccl", "bfloat16")
    if check == "NATIVE_FSDP_VLLM":
        assert (cfg.distributed.strategy, cfg.rollout.engine) == ("fsdp", "vllm")
        assert cfg.checkpoint.interval > 0
        return
    # the bare image's checks: HF generation, the bf16 reward model written in WORK
    assert cfg.rollout.engine == "hf" and cfg.policy.path == f"{tmp_path}/policy"
    assert cfg.data.train_file == f"{tmp_path}/prompts/train.jsonl" and cfg.data.task is None
    assert cfg.reward is not None and cfg.reward.direction_model is not None
    rm = cfg.reward.direction_model
    assert (rm.kind, rm.path, rm.dtype) == ("seq_classification", f"{tmp_path}/rm", "bfloat16")
    if check == "NATIVE_DATC":
        assert cfg.credit.name == "datc" and cfg.distributed.strategy == "fsdp"
        assert (cfg.steps, cfg.checkpoint.interval) == (4, 2)
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
    assert "runs openrlhf_ppo_gae_abc" in SCRIPT.read_text()
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
    log.write(json.dumps({"argv": args, "path": os.environ.get("PYTHONPATH", "")}) + "\\n")
if args[:1] == ["-c"] and "find_spec" in args[1]:  # the scripts' module probe
    missing = os.environ.get("STUB_MISSING", "").split()
    print(" ".join(m for m in args[2:] if m in missing))
fail = os.environ.get("STUB_FAIL")
sys.exit(1 if fail and any(fail in a for a in args) else 0)
"""


@dataclass(frozen=True)
class Call:
    """One call of the stub python: its arguments and the PYTHONPATH it was given."""

    argv: list[str]
    pythonpath: list[str]


def dry_run(
    script: Path, tmp_path: Path, env: dict[str, str], args: tuple[str, ...] = ()
) -> tuple[subprocess.CompletedProcess[str], list[Call]]:
    """Run ``script`` with ``PYTHON`` a stub that records each call and exits 0 (1 where an
    argument contains ``STUB_FAIL``; its module probe finds all but ``STUB_MISSING``), and
    ``nvidia-smi`` a stub: the script's exit status and output, and every python call in
    order."""
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
    records = [json.loads(line) for line in lines]
    return done, [Call(r["argv"], r["path"].split(":")) for r in records]


def test_the_openrlhf_scripts_trl_section_runs_its_three_trl_runs(tmp_path: Path) -> None:
    """``TRL_ONLY=1``: the section reaches its three ``accelerate launch`` runs (uniform,
    datc, datc with LoRA) under the ZeRO-3 config and its metric check, and ends with 0
    (a stray line there once made it exit 127 before anything ran)."""
    done, calls = dry_run(OPENRLHF_SCRIPT, tmp_path, {"TRL_ONLY": "1", "BENCH": "0"})
    assert done.returncode == 0, done.stdout + done.stderr
    launches = [c.argv for c in calls if c.argv[:2] == ["-m", "accelerate.commands.launch"]]
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


# The image the device tool lends, once the wheelhouse is installed (the device's KINDS.md)
BARE_IMAGE_LACKS = "vllm deepspeed ray flash_attn openrlhf verl"
ZERO3_TRL = ["trl_zero3_rm_datc", "trl_zero3_rm_datc_mid", "trl_zero3_one_pass"]
ZERO3_TRL += ["trl_zero3_direction"]
OPENRLHF_CHECKS = ["openrlhf", "openrlhf_zero3_one_pass_datc", "openrlhf_packed_datc_mid"]
OPENRLHF_CHECKS += ["openrlhf_ppo_gae_abc"]


def wheelhouse(tmp_path: Path) -> Path:
    folder = tmp_path / "wheelhouse"
    folder.mkdir()
    for name in ("pydantic-2.14.4-py3-none-any.whl", "trl-1.16.0-py3-none-any.whl"):
        (folder / name).write_bytes(b"")
    return folder


def bare_run(
    tmp_path: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], list[Call]]:
    """``gpu_smoke.sh --bare-image`` on the image as it is (``BARE_IMAGE_LACKS``), the
    native datc run's last checkpoint present (the stub writes none)."""
    (tmp_path / "work" / "native_datc_run" / "checkpoints" / "step_000004").mkdir(parents=True)
    base = {"STUB_MISSING": BARE_IMAGE_LACKS, "WHEELHOUSE": str(wheelhouse(tmp_path))}
    return dry_run(SCRIPT, tmp_path, {**base, **(env or {})}, ("--bare-image",))


def lines(done: subprocess.CompletedProcess[str], verdict: str) -> dict[str, str]:
    """The script's ``PASS``/``FAIL``/``SKIP`` lines: check name -> the rest of the line."""
    out = {}
    for line in done.stdout.splitlines():
        if line.startswith(f"{verdict} "):
            name, _, rest = line[len(verdict) + 1 :].partition(" ")
            out[name] = rest
    return out


def test_the_bare_image_mode_installs_the_wheelhouse_and_runs_its_three_checks(
    tmp_path: Path,
) -> None:
    done, calls = bare_run(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    work, site = tmp_path / "work", str(tmp_path / "work" / "site")
    # first the wheels, from the folder alone, into a folder of their own (the image's venv
    # is not written)
    install = calls[0].argv
    assert install[:3] == ["-m", "pip", "install"]
    assert {"--no-index", "--no-deps"} <= set(install)
    assert install[install.index("--target") + 1] == site
    wheels = sorted(str(p) for p in (tmp_path / "wheelhouse").glob("*.whl"))
    assert sorted(a for a in install if a.endswith(".whl")) == wheels
    # then every python call sees the wheels first, then the working tree (no wheel of it)
    for call in calls[1:]:
        assert call.pythonpath[:2] == [site, str(REPO)], call

    s = settings(work)
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1"]
    native = [*torchrun, "-m", "backends.torch", *s["NATIVE_CONFIG"], *s["NATIVE_GPU"]]
    native += s["NATIVE_WORK_MODELS"]
    argvs = [c.argv for c in calls]
    assert [*native, *s["NATIVE_DATC"], "--set", f"output_dir={work}/native_datc_run"] in argvs
    mid = [*native, *s["NATIVE_DATC_MID"], "--set", f"output_dir={work}/native_datc_mid_run"]
    assert mid in argvs
    # TRL in one process: no accelerate launch, no DeepSpeed config; HF generation
    [trl] = [a for a in argvs if "backends.trl" in a]
    assert trl[:4] == ["-m", "backends.trl", "--config", *s["TRL_CONFIG"]]
    assert trl[trl.index("--credit") + 1] == "datc"
    assert trl[trl.index("--reward_model_name_or_path") + 1] == f"{work}/rm"
    run_calls = [a for a in argvs if a[:1] == ["-m"] and a[1] != "pip"]
    assert len(run_calls) == 3, run_calls  # nothing else is launched
    assert not any("vllm" in " ".join(a) or "accelerate" in " ".join(a) for a in run_calls)

    assert s["BARE_CHECKS"] == ["native_datc", "native_datc_mid", "trl_rm_datc"]
    assert list(lines(done, "PASS")) == s["BARE_CHECKS"] and not lines(done, "FAIL")
    skipped = lines(done, "SKIP")
    assert skipped == {
        "native_fsdp_vllm": "(needs vllm: not in the bare image)",
        "native_resume": "(needs vllm: not in the bare image)",
        **dict.fromkeys(ZERO3_TRL, "(needs deepspeed: not in the bare image)"),
        **dict.fromkeys(
            OPENRLHF_CHECKS, "(needs openrlhf ray vllm deepspeed flash_attn: not in the bare image)"
        ),
        "verl": "(needs verl ray vllm flash_attn: not in the bare image)",
    }
    assert "== 3 passed, 0 failed, 11 skipped" in done.stdout


def test_a_bare_image_check_that_fails_prints_fail_and_counts_in_the_exit_status(
    tmp_path: Path,
) -> None:
    done, _ = bare_run(tmp_path, {"STUB_FAIL": "backends.trl"})
    assert lines(done, "FAIL") == {"trl_rm_datc": f"(log: {tmp_path}/work/trl_rm_datc.log)"}
    assert list(lines(done, "PASS")) == ["native_datc", "native_datc_mid"]
    assert done.returncode == 1


def test_the_native_datc_check_fails_without_its_last_checkpoint(tmp_path: Path) -> None:
    env = {"STUB_MISSING": BARE_IMAGE_LACKS, "WHEELHOUSE": str(wheelhouse(tmp_path))}
    done, _ = dry_run(SCRIPT, tmp_path, env, ("--bare-image",))
    assert list(lines(done, "FAIL")) == ["native_datc"] and done.returncode == 1


def test_a_module_the_wheelhouse_should_have_given_fails_its_bare_check(tmp_path: Path) -> None:
    done, _ = bare_run(tmp_path, {"STUB_MISSING": f"{BARE_IMAGE_LACKS} datasets"})
    wheels = tmp_path / "wheelhouse"
    assert lines(done, "FAIL") == {"trl_rm_datc": f"(needs datasets: not installed from {wheels})"}
    assert done.returncode == 1


def test_the_bare_image_mode_without_wheels_says_how_to_make_them(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    env = {"WHEELHOUSE": str(tmp_path / "empty")}
    done, calls = dry_run(SCRIPT, tmp_path, env, ("--bare-image",))
    assert done.returncode == 1 and calls == []
    assert "make wheelhouse" in done.stdout and ".wheelhouse" in done.stdout


def test_an_unknown_argument_is_refused(tmp_path: Path) -> None:
    done, calls = dry_run(SCRIPT, tmp_path, {}, ("--bare",))
    assert done.returncode == 2 and calls == [] and "--bare-image" in done.stderr


def test_the_full_mode_without_vllm_or_deepspeed_runs_the_checks_that_need_neither(
    tmp_path: Path,
) -> None:
    """A missing vLLM skips only the checks that use it (it once stopped the whole script)."""
    (tmp_path / "work" / "native_datc_run" / "checkpoints" / "step_000004").mkdir(parents=True)
    done, calls = dry_run(SCRIPT, tmp_path, {"STUB_MISSING": "vllm deepspeed"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert not any(c.argv[:3] == ["-m", "pip", "install"] for c in calls)
    assert list(lines(done, "PASS")) == ["native_datc", "native_datc_mid", "trl_rm_datc"]
    assert lines(done, "SKIP") == {
        "native_fsdp_vllm": "(needs vllm: not installed)",
        "native_resume": "(needs vllm: not installed)",
        **dict.fromkeys(ZERO3_TRL, "(needs deepspeed: not installed)"),
    }


def test_the_full_mode_runs_the_zero3_trl_checks_under_accelerate_when_deepspeed_is_there(
    tmp_path: Path,
) -> None:
    done, calls = dry_run(SCRIPT, tmp_path, {"STUB_MISSING": "vllm", "ONLY": " ".join(ZERO3_TRL)})
    assert done.returncode == 0, done.stdout + done.stderr
    launches = [c.argv for c in calls if c.argv[:2] == ["-m", "accelerate.commands.launch"]]
    config = str(REPO / "configs/trl/accelerate_zero3_1gpu.yaml")
    assert [a[2:6] for a in launches] == [["--config_file", config, "-m", "backends.trl"]] * 4
    credits = [a[a.index("--credit") + 1] for a in launches]
    assert credits == ["datc", "datc_mid", "datc", "datc"]
    assert list(lines(done, "PASS")) == ZERO3_TRL


def test_the_verl_smoke_skips_every_check_naming_flash_attn_when_it_is_missing(
    tmp_path: Path,
) -> None:
    done, calls = dry_run(
        REPO / "scripts" / "verl_gpu_smoke.sh", tmp_path, {"STUB_MISSING": "flash_attn"}
    )
    assert done.returncode == 0, done.stdout + done.stderr
    skipped = lines(done, "SKIP")
    assert list(skipped) == ["verl_uniform", "verl_datc", "verl_grpo_red", "verl_sp_refused"]
    for why in skipped.values():
        assert why.startswith("(needs flash_attn: not installed")
        assert "attn_implementation flash_attention_2" in why
    assert [c.argv[:2] for c in calls] == [["-c", calls[0].argv[1]]]  # the probe, nothing else


def test_the_bare_image_requirement_check_warns_of_each_requirement_the_image_misses(
    tmp_path: Path,
) -> None:
    """After the install, gpu_smoke.sh warns of every requirement of the wheelhouse's
    distributions that the image does not meet (run here on a made-up distribution)."""
    text = SCRIPT.read_text()
    start = text.index("\n", text.index("<<'REQUIREMENTS'")) + 1
    check = text[start : text.index("\nREQUIREMENTS\n")]
    info = tmp_path / "site" / "made_up-1.0.dist-info"
    info.mkdir(parents=True)
    requires = ["packaging>=1", "pytest<1", "no-such-dist-here", 'pytest<1; extra == "x"']
    meta = "Metadata-Version: 2.1\nName: made-up\nVersion: 1.0\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    (info / "METADATA").write_text(meta)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'site'}:{REPO}"}
    out = subprocess.run(
        [sys.executable, "-c", check, str(tmp_path / "site")],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout.splitlines()
    assert len(out) == 2, out
    assert out[0].startswith("WARNING: made-up needs pytest<1, found pytest ")
    assert out[1] == "WARNING: made-up needs no-such-dist-here: not installed"


# ------------------------------------------------------------------------- make wheelhouse
WHEELHOUSE_SCRIPT = REPO / "scripts" / "wheelhouse.sh"
PIP_STUB = """\
import json, os, sys, zipfile
args = sys.argv[1:]
if args[:3] != ["-m", "pip", "download"]:
    os.execv(sys.executable, [sys.executable, *args])  # the script's own checks run for real
with open(os.environ["STUB_LOG"], "a") as log:
    log.write(json.dumps(args) + "\\n")
folder = args[args.index("-d") + 1]
for name, version, requires, size in json.loads(os.environ["STUB_WHEELS"]):
    meta = f"Name: {name}\\nVersion: {version}\\n"
    meta += "".join(f"Requires-Dist: {r}\\n" for r in requires)
    path = f"{folder}/{name.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA", meta)
        z.writestr("padding", os.urandom(size))
"""
# the real wheels' requirements (their METADATA, less the extras)
CONSISTENT = [
    ["pydantic", "2.14.4", ["pydantic-core==2.50.5", "annotated-types>=0.6.0"], 0],
    ["pydantic-core", "2.50.5", ["typing-extensions>=4.16.0"], 0],
    ["annotated-types", "0.8.0", [], 0],
    ["typing-extensions", "4.16.0", [], 0],
    ["trl", "1.16.0", ["accelerate>=1.10.1", "datasets>=4.7.0", 'rich; extra == "x"'], 0],
    ["datasets", "5.2.0", ["dill<0.4.2,>=0.3.0", "pyarrow>=24.0.0", "fsspec<=2026.9.0"], 0],
    ["dill", "0.4.1", [], 0],
    ["fsspec", "2026.9.0", [], 0],
]


def make_wheelhouse(
    tmp_path: Path, wheels: list[list[object]], env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run wheelhouse.sh into ``tmp_path/wh`` with a pip that writes ``wheels`` (name,
    version, requirements, bytes of padding) instead of downloading: its exit status and
    output, and the argv of the one pip download."""
    python = tmp_path / "python"
    python.write_text(f"#!{sys.executable}\n{PIP_STUB}")
    python.chmod(0o755)
    log = tmp_path / "pip.jsonl"
    full_env = {**os.environ, "PYTHON": str(python), "STUB_LOG": str(log)}
    full_env |= {"STUB_WHEELS": json.dumps(wheels), **(env or {})}
    done = subprocess.run(
        ["bash", str(WHEELHOUSE_SCRIPT), str(tmp_path / "wh")],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=60,
    )
    [argv] = [json.loads(line) for line in log.read_text().splitlines()]
    return done, argv


def test_make_wheelhouse_downloads_the_bare_images_wheels_for_its_platform(tmp_path: Path) -> None:
    (tmp_path / "wh").mkdir()
    (tmp_path / "wh" / "stale-0.1-py3-none-any.whl").write_bytes(b"")
    done, argv = make_wheelhouse(tmp_path, CONSISTENT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert argv[:5] == ["-m", "pip", "download", "-q", "--no-deps"]
    for flag in ("--only-binary=:all:", "--platform", "manylinux2014_x86_64"):
        assert flag in argv
    assert argv[argv.index("--python-version") + 1] == "3.12"
    assert argv[argv.index("--implementation") + 1] == "cp"
    assert argv[argv.index("-c") + 1] == str(REPO / "constraints.txt")
    assert argv[argv.index("-d") + 1] == str(tmp_path / "wh")
    settings_ = bash_arrays(WHEELHOUSE_SCRIPT, ["WHEELS"])
    assert argv[argv.index("-d") + 2 :] == settings_["WHEELS"]
    assert not (tmp_path / "wh" / "stale-0.1-py3-none-any.whl").exists()  # emptied first
    assert "from the image: accelerate pyarrow" in done.stdout
    assert "== 8 wheels, 0.0 MiB (limit 60 MiB)" in done.stdout


def test_make_wheelhouse_fetches_what_the_image_lacks_pinned_as_constraints_txt_pins(
    tmp_path: Path,
) -> None:
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        name, sep, version = line.partition("==")
        if sep and not line.startswith("#"):
            pins[name.strip().lower()] = version.strip()
    for word in bash_arrays(WHEELHOUSE_SCRIPT, ["WHEELS"])["WHEELS"]:
        name, sep, version = word.partition("==")
        if sep:  # pinned in the script: constraints.txt does not say otherwise
            assert pins.get(name, version) == version, word
        else:
            assert name in pins, f"{name}: unpinned in wheelhouse.sh and constraints.txt"
    names = {w.partition("==")[0] for w in bash_arrays(WHEELHOUSE_SCRIPT, ["WHEELS"])["WHEELS"]}
    assert {"pydantic", "pydantic-core", "trl", "datasets"} <= names


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            ("pydantic-core", "2.51.0", [], 0),
            "pydantic needs pydantic-core==2.50.5, the folder holds pydantic-core 2.51.0",
        ),
        (("dill", "0.4.1", ["no-such-dist"], 0), "dill needs no-such-dist: neither in the folder"),
        (("fsspec", "2026.9.0", [], 2**20 + 1), "the wheels take 1.0 MiB, over 1 MiB"),
    ],
)
def test_make_wheelhouse_fails_on_an_unmet_requirement_or_over_its_size(
    tmp_path: Path, change: tuple[object, ...], message: str
) -> None:
    wheels = [w for w in CONSISTENT if w[0] != change[0]] + [list(change)]
    done, _ = make_wheelhouse(tmp_path, wheels, {"MAX_MIB": "1"})
    assert done.returncode == 1
    assert message in done.stderr, done.stderr


def test_make_wheelhouse_writes_into_the_ignored_wheelhouse_folder() -> None:
    make = subprocess.run(
        ["make", "-n", "wheelhouse"], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert "bash scripts/wheelhouse.sh .wheelhouse" in make.stdout
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", ".wheelhouse/trl-1.16.0-py3-none-any.whl"], cwd=REPO
    )
    assert ignored.returncode == 0
