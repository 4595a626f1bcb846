#!/usr/bin/env bash
# GPU smoke checks of the paths that only a GPU exercises (docs/backends.md, "GPU
# readiness"), on one GPU, offline (models built from configs), about 6-9 minutes:
#
#   native_fsdp_vllm   credit-train under torchrun on one GPU: a one-process NCCL group,
#                      FSDP2, bf16, vLLM rollouts (external launcher, in process), the
#                      preset policy's engine folder written from the full state dict, a
#                      checkpoint (the rank's own CUDA RNG state)
#   native_resume      the same run resumed from its checkpoint for two more steps
#   native_datc_mid    credit-train, NCCL group + DDP, bf16, datc_mid (path gradient)
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
# Each check prints one "PASS name" or "FAIL name" line; the exit status is the number of
# failures. Logs are in $WORK. OPENRLHF=1 also runs scripts/openrlhf_gpu_smoke.sh (OpenRLHF
# and the older TRL runs, 5-10 more minutes) as four more checks: openrlhf (its unpacked runs
# and TRL section), openrlhf_packed_datc_mid (packed OpenRLHF GRPO with datc_mid:
# --ds.packing_samples and --train.dynamic_batch_enable, 2-3 more minutes),
# openrlhf_ppo_gae_abc (OpenRLHF PPO with a critic, --algo.advantage.estimator gae, and
# --credit abc in its paper form, 2-3 more minutes) and openrlhf_zero3_one_pass_datc (OpenRLHF
# GRPO with --ds.zero_stage 3 and datc, its reward and gradient from one pass of the
# partitioned reward model, 2-3 more minutes); VERL=1 also runs
# scripts/verl_gpu_smoke.sh (verl main_ppo with vLLM and credit datc, 3-5 more minutes)
# with VERL_PYTHON (default PYTHON): verl 0.9.1 needs its own environment (docs/verl.md).
#
# Needs: 1 NVIDIA GPU; python with torch (CUDA), vllm, deepspeed, trl 1.16.x, accelerate,
# and this repository (run from its root, or installed).
# Usage:  bash scripts/gpu_smoke.sh
# Env:    PYTHON (python), WORK (a fresh temp dir), RUN_TIMEOUT (seconds per run, 600),
#         ONLY (space-separated check names to run, default all)
set -uo pipefail

PYTHON=${PYTHON:-python}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=${WORK:-$(mktemp -d /tmp/gpu_smoke.XXXXXX)}
RUN_TIMEOUT=${RUN_TIMEOUT:-600}
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
cd "$REPO" || exit 1
mkdir -p "$WORK"
echo "== work dir: $WORK"

# BEGIN SETTINGS (read by tests/test_gpu_smoke_script.py)
NATIVE_CONFIG=configs/torch/tiny_datc.yaml
TRL_CONFIG=configs/trl/gpu_zero3_rm.yaml
NATIVE_GPU=(--set device=cuda --set distributed.backend=nccl --set policy.dtype=bfloat16
  --set logging.progress=false --set logging.tensorboard=false)
NATIVE_FSDP_VLLM=(--set distributed.strategy=fsdp --set rollout.engine=vllm
  --set rollout.vllm.gpu_memory_utilization=0.3 --set checkpoint.interval=2
  --set eval.interval=2)
NATIVE_DATC_MID=(--set distributed.strategy=ddp --set credit.name=datc_mid
  --set checkpoint.interval=0 --set eval.interval=0 --set steps=3)
OPENRLHF_RUNS="uniform datc datc_mid"  # openrlhf_packed_datc_mid runs datc_mid_packed
# END SETTINGS

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
"$PYTHON" - <<'EOF' || exit 1
import importlib.util, sys
missing = [m for m in ("torch", "vllm", "deepspeed", "trl", "accelerate")
           if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"missing python packages: {missing}")
import torch
assert torch.cuda.is_available(), "torch sees no CUDA device"
print("torch", torch.__version__, "| cuda ok")
EOF

# ---------------------------------------------------------------------- native trainer
TORCHRUN=("$PYTHON" -m torch.distributed.run --standalone --nproc_per_node 1 -m backends.torch)
NATIVE_RUN=$WORK/native_run
if wanted native_fsdp_vllm || wanted native_resume; then
  logged native_fsdp_vllm "${TORCHRUN[@]}" "$NATIVE_CONFIG" "${NATIVE_GPU[@]}" \
    "${NATIVE_FSDP_VLLM[@]}" --set steps=4 --set output_dir="$NATIVE_RUN" \
    && steps_logged "$NATIVE_RUN" 1 4 >>"$WORK/native_fsdp_vllm.log" 2>&1 \
    && [[ -d $NATIVE_RUN/checkpoints/step_000004 && -f $NATIVE_RUN/policy_init/config.json ]]
  result native_fsdp_vllm $?
fi
if wanted native_resume; then
  logged native_resume "${TORCHRUN[@]}" "$NATIVE_CONFIG" "${NATIVE_GPU[@]}" \
    "${NATIVE_FSDP_VLLM[@]}" --set steps=6 --set output_dir="$NATIVE_RUN" --resume \
    && steps_logged "$NATIVE_RUN" 1 6 >>"$WORK/native_resume.log" 2>&1 \
    && [[ -d $NATIVE_RUN/checkpoints/step_000006 ]]
  result native_resume $?
fi
if wanted native_datc_mid; then
  logged native_datc_mid "${TORCHRUN[@]}" "$NATIVE_CONFIG" "${NATIVE_GPU[@]}" \
    "${NATIVE_DATC_MID[@]}" --set output_dir="$WORK/native_datc_mid_run" \
    && steps_logged "$WORK/native_datc_mid_run" 1 3 >>"$WORK/native_datc_mid.log" 2>&1
  result native_datc_mid $?
fi

# ------------------------------------------------------------- TRL, ZeRO-3, a reward model
if wanted trl_zero3_rm_datc || wanted trl_zero3_rm_datc_mid || wanted trl_zero3_one_pass \
  || wanted trl_zero3_direction; then
  echo "== creating a tiny policy, reward model (one tokenizer) and prompts in $WORK"
  "$PYTHON" - "$WORK" <<'EOF' || exit 1
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
trl_check() {  # trl_check NAME CREDIT [METRIC [EXTRA ARGS...]]: METRIC must be logged too
  local name=$1 credit=$2 metric=${3:-credit/weight_max}
  shift $(($# < 3 ? $# : 3))
  logged "$name" "$PYTHON" -m accelerate.commands.launch --config_file "$REPO/configs/trl/accelerate_zero3_1gpu.yaml" \
    -m backends.trl --config "$TRL_CONFIG" --model_name_or_path "$WORK/policy" \
    --reward_model_name_or_path "$WORK/rm" --dataset_name "$WORK/prompts" \
    --output_dir "$WORK/${name}_out" --credit "$credit" "$@" \
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
wanted trl_zero3_rm_datc && trl_check trl_zero3_rm_datc datc
wanted trl_zero3_rm_datc_mid && trl_check trl_zero3_rm_datc_mid datc_mid
wanted trl_zero3_one_pass && trl_check trl_zero3_one_pass datc credit/reward_grad_second_pass_frac
wanted trl_zero3_direction && trl_check trl_zero3_direction datc credit/weight_max \
  --direction "{\"kind\": \"seq_classification\", \"path\": \"$WORK/rm\"}"

# ---------------------------------------------------------------------------- OpenRLHF
if [[ "${OPENRLHF:-0}" == 1 ]] && wanted openrlhf; then
  mkdir -p "$WORK/openrlhf"
  WORK=$WORK/openrlhf RUNS="$OPENRLHF_RUNS" logged openrlhf bash scripts/openrlhf_gpu_smoke.sh
  result openrlhf $?
fi
if [[ "${OPENRLHF:-0}" == 1 ]] && wanted openrlhf_zero3_one_pass_datc; then
  mkdir -p "$WORK/openrlhf_zero3"
  WORK=$WORK/openrlhf_zero3 RUNS=datc_zero3 BENCH=0 TRL=0 \
    logged openrlhf_zero3_one_pass_datc bash scripts/openrlhf_gpu_smoke.sh
  result openrlhf_zero3_one_pass_datc $?
fi
if [[ "${OPENRLHF:-0}" == 1 ]] && wanted openrlhf_packed_datc_mid; then
  mkdir -p "$WORK/openrlhf_packed"
  WORK=$WORK/openrlhf_packed RUNS=datc_mid_packed BENCH=0 TRL=0 \
    logged openrlhf_packed_datc_mid bash scripts/openrlhf_gpu_smoke.sh
  result openrlhf_packed_datc_mid $?
fi
if [[ "${OPENRLHF:-0}" == 1 ]] && wanted openrlhf_ppo_gae_abc; then
  mkdir -p "$WORK/openrlhf_ppo_gae"
  WORK=$WORK/openrlhf_ppo_gae RUNS=ppo_gae_abc BENCH=0 TRL=0 \
    logged openrlhf_ppo_gae_abc bash scripts/openrlhf_gpu_smoke.sh
  result openrlhf_ppo_gae_abc $?
fi

# -------------------------------------------------------------------------------- verl
if [[ "${VERL:-0}" == 1 ]] && wanted verl; then
  WORK=$WORK/verl PYTHON=${VERL_PYTHON:-$PYTHON} logged verl bash scripts/verl_gpu_smoke.sh
  result verl $?
fi

echo "== $FAILED failed"
exit "$FAILED"
