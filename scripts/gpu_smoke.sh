#!/usr/bin/env bash
# GPU smoke checks of the paths that only a GPU exercises (docs/backends.md, "GPU
# readiness"), on one GPU, offline (models built from configs), about 8-12 minutes:
#
#   native_fsdp_vllm   credit-train under torchrun on one GPU: a one-process NCCL group,
#                      FSDP2, bf16, vLLM rollouts (external launcher, in process), the
#                      preset policy's engine folder written from the full state dict, a
#                      checkpoint (the rank's own CUDA RNG state)
#   native_resume      the same run resumed from its checkpoint for two more steps
#   native_datc        credit-train, NCCL group + FSDP2, bf16, HF generation, datc with a bf16
#                      reward model (the tiny one written in $WORK) as the direction model and
#                      the reward, a checkpoint
#   native_datc_mid    credit-train, NCCL group + DDP, bf16, datc_mid (the path gradient)
#                      through the same bf16 reward model
#   trl_rm_datc        credit-trl in one process (no accelerate launch, no DeepSpeed), bf16, HF
#                      generation, the reward model as TRL's reward function and as the
#                      direction model, datc
#   trl_zero3_rm_datc      credit-trl under accelerate + DeepSpeed ZeRO-3, a reward model as
#   trl_zero3_rm_datc_mid  TRL's reward function and as the direction model (its embedding
#                          table read gathered), with datc and with datc_mid (the policy's
#                          LM head read gathered)
#   trl_zero3_one_pass     datc, TRL's reward model giving reward and gradient from one pass
#                          (credit/reward_grad_second_pass_frac logged; the pass counts agreed
#                          over processes: adapters.direction.agree_count, fill_unmatched)
#   trl_zero3_direction    datc with an explicit direction: (the reward model's folder),
#                          loaded whole outside zero.Init (adapters.partitioned.outside_zero3_init)
#
# Each check prints one "PASS name", "FAIL name" or "SKIP name (why)" line; the exit status is
# the number of failures. A check whose python packages are missing is skipped, naming them
# (NEEDS below; vllm only for the first two). Logs are in $WORK. OPENRLHF=1 also runs
# scripts/openrlhf_gpu_smoke.sh (OpenRLHF and the older TRL runs, 5-10 more minutes) as four
# more checks: openrlhf (its unpacked runs and TRL section), openrlhf_packed_datc_mid (packed
# OpenRLHF GRPO with datc_mid: --ds.packing_samples and --train.dynamic_batch_enable, 2-3 more
# minutes), openrlhf_ppo_gae_abc (OpenRLHF PPO with a critic, --algo.advantage.estimator gae,
# and --credit abc in its paper form, 2-3 more minutes) and openrlhf_zero3_one_pass_datc
# (OpenRLHF GRPO with --ds.zero_stage 3 and datc, its reward and gradient from one pass of the
# partitioned reward model, 2-3 more minutes); VERL=1 also runs scripts/verl_gpu_smoke.sh (verl
# main_ppo with vLLM and credit datc, 3-5 more minutes) with VERL_PYTHON (default PYTHON): verl
# 0.9.1 needs its own environment (docs/verl.md), and flash-attn (verl loads the policy with
# attn_implementation flash_attention_2).
#
# --bare-image (or SMOKE_IMAGE=bare): the GPU image the device tool lends (torch, transformers,
# accelerate, peft; no pydantic, trl, datasets, deepspeed, ray, vllm, flash-attn; nothing to
# fetch): installs the wheels of `make wheelhouse` (WHEELHOUSE, carried to the machine) with
# `pip install --no-index --target $WORK/site`, runs native_datc, native_datc_mid and
# trl_rm_datc (HF generation, no DeepSpeed; 3-5 minutes, each run at most RUN_TIMEOUT=130 s)
# and skips every other check, naming what it needs. The repository travels as the working
# tree and is put on PYTHONPATH (no wheel of it). With the device tool, from the repository:
#   run(command="bash scripts/gpu_smoke.sh --bare-image", carry=[".wheelhouse"], timeout_s=540)
#
# Needs: 1 NVIDIA GPU; python with torch (CUDA), transformers, pydantic, and per check vllm,
# deepspeed, trl 1.16.x, datasets, accelerate; this repository (run from its root, or installed).
# Usage:  bash scripts/gpu_smoke.sh [--bare-image]
# Env:    PYTHON (python; python3 with --bare-image), WORK (a fresh temp dir), RUN_TIMEOUT
#         (seconds per run, 600; 130 with --bare-image), ONLY (space-separated check names to
#         run, default all), WHEELHOUSE (.wheelhouse, --bare-image only)
set -uo pipefail

SMOKE_IMAGE=${SMOKE_IMAGE:-full}
for arg in "$@"; do
  case $arg in
    --bare-image) SMOKE_IMAGE=bare ;;
    *) echo "usage: bash scripts/gpu_smoke.sh [--bare-image]; unknown argument $arg" >&2; exit 2 ;;
  esac
done
if [[ $SMOKE_IMAGE != full && $SMOKE_IMAGE != bare ]]; then
  echo "SMOKE_IMAGE: expected 'full' or 'bare', got '$SMOKE_IMAGE'" >&2
  exit 2
fi
BARE=0
[[ $SMOKE_IMAGE == bare ]] && BARE=1
if [[ $BARE == 1 ]]; then PYTHON=${PYTHON:-python3}; else PYTHON=${PYTHON:-python}; fi
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=${WORK:-$(mktemp -d /tmp/gpu_smoke.XXXXXX)}
if [[ $BARE == 1 ]]; then RUN_TIMEOUT=${RUN_TIMEOUT:-130}; else RUN_TIMEOUT=${RUN_TIMEOUT:-600}; fi
WHEELHOUSE=${WHEELHOUSE:-$REPO/.wheelhouse}
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
cd "$REPO" || exit 1
mkdir -p "$WORK"
echo "== work dir: $WORK ($SMOKE_IMAGE image)"

# BEGIN SETTINGS (read by tests/test_gpu_smoke_script.py)
NATIVE_CONFIG=configs/torch/tiny_datc.yaml
TRL_CONFIG=configs/trl/gpu_zero3_rm.yaml
NATIVE_GPU=(--set device=cuda --set distributed.backend=nccl --set policy.dtype=bfloat16
  --set logging.progress=false --set logging.tensorboard=false)
NATIVE_FSDP_VLLM=(--set distributed.strategy=fsdp --set rollout.engine=vllm
  --set rollout.vllm.gpu_memory_utilization=0.3 --set checkpoint.interval=2
  --set eval.interval=2)
# native_datc, native_datc_mid: the policy, bf16 reward model and prompts written in $WORK
NATIVE_WORK_MODELS=(--set policy.preset=null --set "policy.path=$WORK/policy"
  --set data.task=null --set "data.train_file=$WORK/prompts/train.jsonl"
  --set "reward.direction_model={kind: seq_classification, path: $WORK/rm, dtype: bfloat16}")
NATIVE_DATC=(--set distributed.strategy=fsdp --set rollout.engine=hf
  --set checkpoint.interval=2 --set eval.interval=0 --set steps=4)
NATIVE_DATC_MID=(--set distributed.strategy=ddp --set credit.name=datc_mid
  --set checkpoint.interval=0 --set eval.interval=0 --set steps=3)
OPENRLHF_RUNS="uniform datc datc_mid"  # openrlhf_packed_datc_mid runs datc_mid_packed
BARE_CHECKS=(native_datc native_datc_mid trl_rm_datc)
# END SETTINGS

# The python modules each check needs beside torch, transformers, pydantic, yaml and pluggy
# (verl's: in VERL_PYTHON). openrlhf_gpu_smoke.sh asks for flash_attn in every run.
OPENRLHF_NEEDS="openrlhf ray vllm deepspeed flash_attn tensorboard"
declare -A NEEDS=(
  [native_fsdp_vllm]=vllm [native_resume]=vllm [native_datc]="" [native_datc_mid]=""
  [trl_rm_datc]="trl datasets"
  [trl_zero3_rm_datc]="trl datasets accelerate deepspeed"
  [trl_zero3_rm_datc_mid]="trl datasets accelerate deepspeed"
  [trl_zero3_one_pass]="trl datasets accelerate deepspeed"
  [trl_zero3_direction]="trl datasets accelerate deepspeed"
  [openrlhf]="$OPENRLHF_NEEDS trl peft" [openrlhf_zero3_one_pass_datc]=$OPENRLHF_NEEDS
  [openrlhf_packed_datc_mid]=$OPENRLHF_NEEDS [openrlhf_ppo_gae_abc]=$OPENRLHF_NEEDS
  [verl]="verl ray vllm flash_attn"
)
BASE_NEEDS="torch transformers pydantic yaml pluggy"
BARE_LACKS="vllm deepspeed ray flash_attn openrlhf verl"  # even with the wheelhouse
CHECKS=(native_fsdp_vllm native_resume native_datc native_datc_mid trl_rm_datc
  trl_zero3_rm_datc trl_zero3_rm_datc_mid trl_zero3_one_pass trl_zero3_direction)
if [[ "${OPENRLHF:-0}" == 1 || $BARE == 1 ]]; then
  CHECKS+=(openrlhf openrlhf_zero3_one_pass_datc openrlhf_packed_datc_mid openrlhf_ppo_gae_abc)
fi
[[ "${VERL:-0}" == 1 || $BARE == 1 ]] && CHECKS+=(verl)

# shellcheck source=scripts/smoke_checks.sh
source "$(dirname "${BASH_SOURCE[0]}")/smoke_checks.sh"
steps_logged() {  # steps_logged RUN_DIR FIRST LAST: metrics.jsonl holds exactly steps FIRST..LAST, finite
  "$PYTHON" - "$@" <<'EOF'
import json, math, sys
run, first, last = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = [json.loads(l) for l in open(f"{run}/metrics.jsonl") if l.strip()]
steps = [r["step"] for r in rows if "reward/mean" in r]
assert steps == list(range(first, last + 1)), f"logged steps {steps}, expected {first}..{last}"
bad = [(r["step"], k) for r in rows for k, v in r.items() if isinstance(v, float) and not math.isfinite(v)]
assert not bad, f"non-finite metrics {bad[:5]}"
print(f"steps {steps[0]}..{steps[-1]}, reward/mean {rows[-1].get('reward/mean')}")
EOF
}

echo "== preflight"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || exit 1
if [[ $BARE == 1 ]]; then
  shopt -s nullglob
  WHEELS=("$WHEELHOUSE"/*.whl)
  shopt -u nullglob
  if [[ ${#WHEELS[@]} -eq 0 ]]; then
    echo "no wheels in $WHEELHOUSE: run 'make wheelhouse' where PyPI is reachable, and carry" \
      "the folder (the device tool: carry=[\".wheelhouse\"])"
    exit 1
  fi
  echo "== installing ${#WHEELS[@]} wheels from $WHEELHOUSE into $WORK/site"
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target "$WORK/site" "${WHEELS[@]}" || exit 1
  export PYTHONPATH="$WORK/site:$PYTHONPATH"
  # the wheels' requirements that the image must meet: a warning each, the checks say the rest
  "$PYTHON" - "$WORK/site" <<'REQUIREMENTS'
import sys
from importlib import metadata
from packaging.requirements import Requirement

for dist in metadata.distributions(path=[sys.argv[1]]):
    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            found = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            print(f"WARNING: {dist.metadata['Name']} needs {req}: not installed")
            continue
        if not req.specifier.contains(found, prereleases=True):
            print(f"WARNING: {dist.metadata['Name']} needs {req}, found {req.name} {found}")
REQUIREMENTS
fi
"$PYTHON" - <<'EOF' || exit 1
import torch
assert torch.cuda.is_available(), "torch sees no CUDA device"
print("torch", torch.__version__, "| cuda ok")
EOF

ALL_NEEDS="$BASE_NEEDS"
for name in "${CHECKS[@]}"; do [[ $name == verl ]] || ALL_NEEDS+=" ${NEEDS[$name]}"; done
# shellcheck disable=SC2086  # a list of module names
MISSING=$(missing_modules "$PYTHON" $(tr ' ' '\n' <<<"$ALL_NEEDS" | sort -u)) || exit 1
VERL_MISSING=""
if [[ " ${CHECKS[*]} " == *" verl "* && $BARE == 0 ]]; then
  # shellcheck disable=SC2086
  VERL_MISSING=$(missing_modules "${VERL_PYTHON:-$PYTHON}" $BASE_NEEDS ${NEEDS[verl]}) || exit 1
fi
[[ -z $MISSING ]] || echo "   not installed: $MISSING"
if [[ $BARE == 1 ]]; then
  echo "   bare image: vllm, ray and flash-attn do not fit in what a device call carries" \
    "(64 MiB); deepspeed, openrlhf and verl are not in the wheelhouse"
fi

RUNNING=" "  # the checks that run, chosen once: the others print their SKIP line here
for name in "${CHECKS[@]}"; do
  wanted "$name" || continue
  if [[ $BARE == 1 && " ${BARE_CHECKS[*]} " != *" $name "* ]]; then
    lacks=""
    for module in ${NEEDS[$name]}; do
      [[ " $BARE_LACKS " == *" $module "* ]] && lacks+="${lacks:+ }$module"
    done
    skip "$name" "needs $lacks: not in the bare image"
    continue
  fi
  missing=""
  have=$MISSING
  [[ $name == verl ]] && have=$VERL_MISSING
  for module in $BASE_NEEDS ${NEEDS[$name]}; do
    [[ " $have " == *" $module "* ]] && missing+="${missing:+ }$module"
  done
  if [[ -n $missing && $BARE == 1 ]]; then
    echo "FAIL $name (needs $missing: not installed from $WHEELHOUSE)"
    FAILED=$((FAILED + 1))
  elif [[ -n $missing ]]; then
    skip "$name" "needs $missing: not installed"
  else
    RUNNING+="$name "
  fi
done
runs() { [[ $RUNNING == *" $1 "* ]]; }

# ------------------------------------------- a tiny policy, bf16 reward model and prompts
if runs native_datc || runs native_datc_mid || runs trl_rm_datc || runs trl_zero3_rm_datc \
  || runs trl_zero3_rm_datc_mid || runs trl_zero3_one_pass || runs trl_zero3_direction; then
  echo "== creating a tiny policy, reward model (one tokenizer) and prompts in $WORK"
  "$PYTHON" - "$WORK" <<'EOF' || { echo "FAIL setup"; exit 1; }
import json, os, sys
import torch
from adapters.tiny import tiny_causal_lm, tiny_seq_classifier, train_bpe_tokenizer

work = sys.argv[1]
tok = train_bpe_tokenizer(vocab_size=512)
policy = tiny_causal_lm("qwen2", len(tok), hidden=256, layers=2, heads=4, seed=0,
                        dtype=torch.bfloat16, pad_token_id=tok.pad_token_id,
                        eos_token_id=tok.eos_token_id)
rm = tiny_seq_classifier("llama", len(tok), hidden=128, layers=2, heads=2, seed=1,
                         dtype=torch.bfloat16, pad_token_id=tok.pad_token_id)
for name, model in (("policy", policy), ("rm", rm)):
    model.save_pretrained(f"{work}/{name}")
    tok.save_pretrained(f"{work}/{name}")
os.makedirs(f"{work}/prompts", exist_ok=True)
words = ["the cat", "a small dog", "green tea", "the river", "my friend", "an old song"]
with open(f"{work}/prompts/train.jsonl", "w") as f:
    for i in range(64):
        f.write(json.dumps({"prompt": f"Write about {words[i % len(words)]}:"}) + "\n")
EOF
fi

# ---------------------------------------------------------------------- native trainer
TORCHRUN=("$PYTHON" -m torch.distributed.run --standalone --nproc_per_node 1 -m backends.torch)
NATIVE_RUN=$WORK/native_run
if runs native_fsdp_vllm || runs native_resume; then
  logged native_fsdp_vllm "${TORCHRUN[@]}" "$NATIVE_CONFIG" "${NATIVE_GPU[@]}" \
    "${NATIVE_FSDP_VLLM[@]}" --set steps=4 --set output_dir="$NATIVE_RUN" \
    && steps_logged "$NATIVE_RUN" 1 4 >>"$WORK/native_fsdp_vllm.log" 2>&1 \
    && [[ -d $NATIVE_RUN/checkpoints/step_000004 && -f $NATIVE_RUN/policy_init/config.json ]]
  result native_fsdp_vllm $?
fi
if runs native_resume; then
  logged native_resume "${TORCHRUN[@]}" "$NATIVE_CONFIG" "${NATIVE_GPU[@]}" \
    "${NATIVE_FSDP_VLLM[@]}" --set steps=6 --set output_dir="$NATIVE_RUN" --resume \
    && steps_logged "$NATIVE_RUN" 1 6 >>"$WORK/native_resume.log" 2>&1 \
    && [[ -d $NATIVE_RUN/checkpoints/step_000006 ]]
  result native_resume $?
fi
if runs native_datc; then
  logged native_datc "${TORCHRUN[@]}" "$NATIVE_CONFIG" "${NATIVE_GPU[@]}" \
    "${NATIVE_WORK_MODELS[@]}" "${NATIVE_DATC[@]}" --set output_dir="$WORK/native_datc_run" \
    && steps_logged "$WORK/native_datc_run" 1 4 >>"$WORK/native_datc.log" 2>&1 \
    && [[ -d $WORK/native_datc_run/checkpoints/step_000004 ]]
  result native_datc $?
fi
if runs native_datc_mid; then
  logged native_datc_mid "${TORCHRUN[@]}" "$NATIVE_CONFIG" "${NATIVE_GPU[@]}" \
    "${NATIVE_WORK_MODELS[@]}" "${NATIVE_DATC_MID[@]}" \
    --set output_dir="$WORK/native_datc_mid_run" \
    && steps_logged "$WORK/native_datc_mid_run" 1 3 >>"$WORK/native_datc_mid.log" 2>&1
  result native_datc_mid $?
fi

# ------------------------------------------------------------------ TRL, a reward model
TRL_ZERO3=("$PYTHON" -m accelerate.commands.launch
  --config_file "$REPO/configs/trl/accelerate_zero3_1gpu.yaml")
trl_check() {  # trl_check NAME zero3|plain CREDIT [METRIC [EXTRA ARGS...]]: METRIC must be logged too
  local name=$1 launch=$2 credit=$3 metric=${4:-credit/weight_max}
  shift $(($# < 4 ? $# : 4))
  local -a launcher=("$PYTHON")  # plain: one process, no accelerate launch, no DeepSpeed
  [[ $launch == zero3 ]] && launcher=("${TRL_ZERO3[@]}")
  logged "$name" "${launcher[@]}" -m backends.trl --config "$TRL_CONFIG" \
    --model_name_or_path "$WORK/policy" --reward_model_name_or_path "$WORK/rm" \
    --dataset_name "$WORK/prompts" --output_dir "$WORK/${name}_out" --credit "$credit" "$@" \
    && "$PYTHON" - "$WORK/$name.log" "$metric" >>"$WORK/$name.log" 2>&1 <<'EOF'
import ast, sys
rows = [ast.literal_eval(l.strip()) for l in open(sys.argv[1]) if l.startswith("{'loss'")]
assert rows and all("credit/weight_max" in r for r in rows), "credit metrics missing"
assert all(sys.argv[2] in r for r in rows), f"{sys.argv[2]} missing"
assert max(float(r["credit/weight_max"]) for r in rows) > 1.0, "weights should be uneven"
print("steps", len(rows), "weight_max", rows[-1]["credit/weight_max"])
EOF
  result "$name" $?
}
runs trl_rm_datc && trl_check trl_rm_datc plain datc
runs trl_zero3_rm_datc && trl_check trl_zero3_rm_datc zero3 datc
runs trl_zero3_rm_datc_mid && trl_check trl_zero3_rm_datc_mid zero3 datc_mid
runs trl_zero3_one_pass && trl_check trl_zero3_one_pass zero3 datc credit/reward_grad_second_pass_frac
runs trl_zero3_direction && trl_check trl_zero3_direction zero3 datc credit/weight_max \
  --direction "{\"kind\": \"seq_classification\", \"path\": \"$WORK/rm\"}"

# ---------------------------------------------------------------------------- OpenRLHF
if runs openrlhf; then
  mkdir -p "$WORK/openrlhf"
  WORK=$WORK/openrlhf RUNS="$OPENRLHF_RUNS" logged openrlhf bash scripts/openrlhf_gpu_smoke.sh
  result openrlhf $?
fi
if runs openrlhf_zero3_one_pass_datc; then
  mkdir -p "$WORK/openrlhf_zero3"
  WORK=$WORK/openrlhf_zero3 RUNS=datc_zero3 BENCH=0 TRL=0 \
    logged openrlhf_zero3_one_pass_datc bash scripts/openrlhf_gpu_smoke.sh
  result openrlhf_zero3_one_pass_datc $?
fi
if runs openrlhf_packed_datc_mid; then
  mkdir -p "$WORK/openrlhf_packed"
  WORK=$WORK/openrlhf_packed RUNS=datc_mid_packed BENCH=0 TRL=0 \
    logged openrlhf_packed_datc_mid bash scripts/openrlhf_gpu_smoke.sh
  result openrlhf_packed_datc_mid $?
fi
if runs openrlhf_ppo_gae_abc; then
  mkdir -p "$WORK/openrlhf_ppo_gae"
  WORK=$WORK/openrlhf_ppo_gae RUNS=ppo_gae_abc BENCH=0 TRL=0 \
    logged openrlhf_ppo_gae_abc bash scripts/openrlhf_gpu_smoke.sh
  result openrlhf_ppo_gae_abc $?
fi

# -------------------------------------------------------------------------------- verl
if runs verl; then
  mkdir -p "$WORK/verl"
  WORK=$WORK/verl PYTHON=${VERL_PYTHON:-$PYTHON} logged verl bash scripts/verl_gpu_smoke.sh
  result verl $?
fi

echo "== $PASSED passed, $FAILED failed, $SKIPPED skipped in $SECONDS s"
exit "$FAILED"
