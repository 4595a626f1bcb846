#!/usr/bin/env bash
# GPU smoke run of the OpenRLHF integration: first the signals benchmark in GPU mode
# (`python -m benchmarks signals --device cuda`: policy_stats and the two-matmul W0, both in
# bf16, each against the LM head in the same run), then a few GRPO steps of OpenRLHF 0.11 (Ray,
# DeepSpeed, vLLM rollouts) with `--credit uniform`, then with `--credit datc` (the one-pass
# path: OpenRLHF's reward model gives the reward and its gradient), then `--credit datc_mid`
# (m1 from OpenRLHF's log-prob forward, the path gradient on the reward actors), then
# `datc_mid_packed`: `--credit datc_mid` with packed samples and dynamic batches
# (`--ds.packing_samples --train.dynamic_batch_enable`, flash-attention 2: the statistics
# read from the Actor's packed logits); `datc_zero3` (on request): `--credit datc` with
# `--ds.zero_stage 3` (the one reward-model pass through ZeRO-3 partitions); on a tiny Qwen2
# policy and a tiny Llama reward model
# created from configs (no download). Checks that each run finishes, that the token-credit
# experience maker was installed in the trainer actor, and that the credit diagnostics
# reached OpenRLHF's TensorBoard logs (uniform: weights all 1; datc, datc_mid,
# datc_mid_packed: uneven weights; datc: the reward logged; datc_mid, datc_mid_packed: no
# extra policy forward). `ppo_gae_abc` (not in the default RUNS): PPO with OpenRLHF's critic
# (`--algo.advantage.estimator gae`) and `--credit abc --credit.mode paper`, ABC's token
# rewards shifting OpenRLHF's, its attention from the tiny Llama reward model (checks: a
# critic loss logged, uneven weights).
#
# Needs: 1+ NVIDIA GPU; python with torch (CUDA), openrlhf 0.11.x, vllm, flash-attn,
# deepspeed, ray, tensorboard, and this repository (run from its root, or installed).
# Usage:  bash scripts/openrlhf_gpu_smoke.sh            (about 5-10 minutes on one GPU)
# Env:    PYTHON (python), WORK (a fresh temp dir), POLICY / RM (existing local HF folders
#         instead of the tiny ones; the RM must load as a one-label sequence classifier
#         and share the policy's tokenizer), ATTN (sdpa), RUN_TIMEOUT (seconds per run, 1200),
#         BENCH (1; 0 skips the benchmark), BENCH_ARGS (extra benchmark flags, e.g. --quick),
#         RUNS (the OpenRLHF runs, default "uniform datc datc_mid datc_mid_packed"; datc_zero3 on request),
#         TRL (1; 0 skips the TRL section)
#
# TRL section (after the OpenRLHF runs; TRL_ONLY=1 runs it alone): credit-trl (TRL 1.16,
# backends/trl) on the same tiny policy and the built-in `positional` task, under
# `accelerate launch` with DeepSpeed ZeRO-3 (bf16): `credit: uniform`, `credit: datc`, and
# `credit: datc` with LoRA. Checks that each run finishes and that the credit diagnostics
# reached TRL's logged metrics (uniform: weights all 1; datc: uneven weights). Needs trl
# 1.16.x and accelerate; TRL_STEPS (8) sets the steps per run.
set -euo pipefail

PYTHON=${PYTHON:-python}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=${WORK:-$(mktemp -d /tmp/openrlhf_smoke.XXXXXX)}
ATTN=${ATTN:-sdpa}
RUN_TIMEOUT=${RUN_TIMEOUT:-1200}
BENCH=${BENCH:-1}
BENCH_ARGS=${BENCH_ARGS:-}
RUNS=${RUNS:-uniform datc datc_mid datc_mid_packed}
TRL=${TRL:-1}
# BEGIN SETTINGS (read by tests/test_gpu_smoke_script.py)
# packed samples and dynamic batches: OpenRLHF packs with flash-attention only
PACKED=(--ds.packing_samples --train.dynamic_batch_enable --rollout.max_tokens_per_gpu 256
  --train.max_tokens_per_gpu 256 --ds.attn_implementation flash_attention_2)
# PPO with a critic (OpenRLHF's GAE, a critic from the reward model's folder) and ABC's paper
# form: its token rewards shift OpenRLHF's (docs/openrlhf.md, "PPO with a critic")
PPO_GAE=(--algo.advantage.estimator gae --critic.num_nodes 1 --critic.num_gpus_per_node 1
  --critic.adam.lr 9e-6)
ZERO3=(--ds.zero_stage 3)  # datc_zero3: the one reward-model pass through ZeRO-3 partitions
# END SETTINGS
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
cd "$REPO"
mkdir -p "$WORK"
echo "== work dir: $WORK"

if [[ -z "${TRL_ONLY:-}" ]]; then
echo "== preflight"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
"$PYTHON" - <<'EOF'
import importlib, sys
missing = [m for m in ("torch", "vllm", "flash_attn", "deepspeed", "ray", "openrlhf", "tensorboard")
           if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"missing python packages: {missing}")
import torch
assert torch.cuda.is_available(), "torch sees no CUDA device"
from backends.openrlhf.version import check_openrlhf_version
print("openrlhf", check_openrlhf_version(), "| torch", torch.__version__, "| cuda ok")
EOF
fi

if [[ "$BENCH" == 1 ]] && nvidia-smi -L >/dev/null 2>&1; then
  echo "== benchmark: signals in GPU mode (bf16), results in $WORK/bench"
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of flags
  timeout "$RUN_TIMEOUT" "$PYTHON" -m benchmarks signals --device cuda --dtype bfloat16 \
    --out "$WORK/bench" $BENCH_ARGS >"$WORK/bench.log" 2>&1 \
    || { tail -n 40 "$WORK/bench.log"; exit 1; }
  sed -n '/^## Targets/,/^## 2\./p' "$WORK/bench/results.md"
fi

if [[ -z "${POLICY:-}" || -z "${RM:-}" ]]; then
  echo "== creating a tiny policy, reward model and tokenizer in $WORK"
  POLICY=$WORK/policy RM=$WORK/rm "$PYTHON" - <<'EOF'
import os
import torch
from adapters.tiny import tiny_causal_lm, tiny_seq_classifier, train_bpe_tokenizer

tok = train_bpe_tokenizer(vocab_size=512)
vocab = len(tok)
policy = tiny_causal_lm("qwen2", vocab, hidden=256, layers=2, heads=4, max_positions=1024,
                        seed=0, dtype=torch.bfloat16,
                        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
rm = tiny_seq_classifier("llama", vocab, hidden=128, layers=2, heads=2, seed=1,
                         dtype=torch.bfloat16, pad_token_id=tok.pad_token_id)
for path, model in ((os.environ["POLICY"], policy), (os.environ["RM"], rm)):
    model.save_pretrained(path)
    tok.save_pretrained(path)
print("vocab", vocab, "policy", sum(p.numel() for p in policy.parameters()),
      "rm", sum(p.numel() for p in rm.parameters()))
EOF
  POLICY=$WORK/policy
  RM=$WORK/rm
fi

"$PYTHON" - "$WORK/prompts.jsonl" <<'EOF'
import json, sys
words = ["the cat", "a small dog", "green tea", "the river", "my friend", "an old song",
         "the sky", "warm bread"]
with open(sys.argv[1], "w") as f:
    for i in range(16):
        f.write(json.dumps({"input": f"Write about {words[i % len(words)]}:"}) + "\n")
EOF

COMMON=(
  --actor.model_name_or_path "$POLICY" --reward.model_name_or_path "$RM"
  --actor.num_nodes 1 --actor.num_gpus_per_node 1
  --ref.num_nodes 1 --ref.num_gpus_per_node 1
  --reward.num_nodes 1 --reward.num_gpus_per_node 1
  --vllm.num_engines 1 --vllm.tensor_parallel_size 1 --vllm.gpu_memory_utilization 0.3
  --vllm.enforce_eager --train.colocate_all
  --algo.advantage.estimator group_norm --algo.kl.use_loss --algo.kl.estimator k3
  --algo.kl.init_coef 0.001
  --rollout.n_samples_per_prompt 4 --rollout.batch_size 4 --rollout.micro_batch_size 4
  --train.batch_size 16 --train.micro_batch_size 4 --train.max_epochs 1 --train.num_episodes 1
  --rollout.max_new_tokens 24 --data.max_len 96 --rollout.temperature 1.0
  --data.prompt_dataset "$WORK/prompts.jsonl" --data.input_key input --data.max_samples 16
  --ds.zero_stage 2 --ds.param_dtype bf16 --ds.attn_implementation "$ATTN"
  --actor.adam.lr 1e-5 --train.seed 42 --logger.logging_steps 1
)

wanted_run() { [[ " $RUNS " == *" $1 "* ]]; }
run() {  # run NAME --credit STRATEGY [FLAGS...]: FLAGS come after COMMON (later flags win)
  local name=$1 strategy=$3; shift
  wanted_run "$name" || return 0
  echo "== run $name: credit-openrlhf $*"
  local start=$SECONDS
  set +e
  timeout "$RUN_TIMEOUT" "$PYTHON" -m backends.openrlhf "${COMMON[@]}" "$@" \
    --logger.tensorboard_dir "$WORK/tb_$name" --logger.wandb.run_name "$name" \
    --ckpt.output_dir "$WORK/out_$name" --ckpt.path "$WORK/ckpt_$name" \
    >"$WORK/$name.log" 2>&1
  local status=$?
  set -e
  echo "   exit $status after $((SECONDS - start)) s (log: $WORK/$name.log)"
  if [[ $status -ne 0 ]]; then tail -n 60 "$WORK/$name.log"; exit 1; fi
  grep -q "token credit: installed ${strategy} in PPOTrainer@" "$WORK/$name.log" \
    || { echo "no installation line in $name.log"; exit 1; }
}

if [[ -z "${TRL_ONLY:-}" ]]; then
run uniform --credit uniform
run datc --credit datc --credit.beta 1.0 --credit.lam 0.5
run datc_mid --credit datc_mid --credit.beta 1.0 --credit.lam 0.5
run datc_mid_packed --credit datc_mid --credit.beta 1.0 --credit.lam 0.5 "${PACKED[@]}"
run ppo_gae_abc --credit abc --credit.mode paper "${PPO_GAE[@]}"
run datc_zero3 --credit datc --credit.beta 1.0 --credit.lam 0.5 "${ZERO3[@]}"

echo "== checking the logged credit diagnostics"
"$PYTHON" - "$WORK" "$RUNS" <<'EOF'
import glob, os, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

work, runs = sys.argv[1], sys.argv[2].split()

def scalars(name):
    [run_dir] = glob.glob(os.path.join(work, f"tb_{name}", name))
    acc = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}

logged = {name: scalars(name) for name in runs}
need = ["train/credit/weight_max", "train/credit/weight_min", "train/credit/weight_entropy",
        "train/credit/frac_upweighted", "train/policy_loss"]
for name, logs in logged.items():
    missing = [t for t in need if t not in logs]
    assert not missing, f"{name}: missing scalars {missing}; have {sorted(logs)}"
    print(f"{name:15s} steps={len(logs['train/policy_loss'])} "
          + " ".join(f"{t.split('/')[-1]}={logs[t][-1]:.4f}" for t in need))
if "uniform" in logged:
    uniform = logged["uniform"]
    assert all(abs(v - 1.0) < 1e-6 for v in uniform["train/credit/weight_max"]), "uniform: w = 1"
    assert all(abs(v - 1.0) < 1e-6 for v in uniform["train/credit/weight_entropy"])
for name in ("datc", "datc_zero3"):
    if name in logged:
        datc = logged[name]
        assert max(datc["train/credit/weight_max"]) > 1.0, f"{name} weights should be uneven"
        assert min(datc["train/credit/weight_entropy"]) < 1.0
        assert "train/credit/direction_reward" in datc and "train/credit/signal_time_s" in datc
        print(f"{name} credit signal time per step (s):",
              [round(v, 3) for v in datc["train/credit/signal_time_s"]])
for name in ("datc_mid", "datc_mid_packed"):
    if name in logged:
        mid = logged[name]
        assert max(mid["train/credit/weight_max"]) > 1.0, f"{name} weights should be uneven"
        assert max(mid["train/credit/extra_policy_forwards"]) == 0.0, f"{name}: m1 from the forward"
if "ppo_gae_abc" in logged:
    gae = logged["ppo_gae_abc"]
    assert "train/critic_loss" in gae, f"ppo_gae_abc: no critic trained; have {sorted(gae)}"
    assert min(gae["train/credit/weight_entropy"]) < 1.0, "ppo_gae_abc: abc's attention unused"
    print("ppo_gae_abc critic_loss:", [round(v, 4) for v in gae["train/critic_loss"]])
print("SMOKE OK")
EOF
fi

# ------------------------------------------------------------------------------------- TRL
[[ "$TRL" == 1 ]] || exit 0
echo "== TRL: preflight"
"$PYTHON" - <<'EOF'
import importlib.util, sys
missing = [m for m in ("trl", "accelerate", "deepspeed", "peft") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"missing python packages: {missing}")
from backends.trl.version import check_trl_version
print("trl", check_trl_version())
EOF

cat >"$WORK/trl.yaml" <<EOF
model_name_or_path: $POLICY
task: positional
task_params: {positions: [2, 9, 17]}
eval_samples_per_prompt: 4
bf16: true
max_steps: ${TRL_STEPS:-8}
per_device_train_batch_size: 32
num_generations: 8
max_completion_length: 24
learning_rate: 0.0003
logging_steps: 1
save_strategy: "no"
report_to: none
disable_tqdm: true
EOF

trl_run() {  # trl_run NAME FLAGS...
  local name=$1; shift
  echo "== TRL run $name: credit-trl $*"
  local start=$SECONDS
  set +e
  timeout "$RUN_TIMEOUT" "$PYTHON" -m accelerate.commands.launch --config_file "$REPO/configs/trl/accelerate_zero3_1gpu.yaml" \
    -m backends.trl --config "$WORK/trl.yaml" --output_dir "$WORK/trl_$name" "$@" \
    >"$WORK/trl_$name.log" 2>&1
  local status=$?
  set -e
  echo "   exit $status after $((SECONDS - start)) s (log: $WORK/trl_$name.log)"
  if [[ $status -ne 0 ]]; then tail -n 60 "$WORK/trl_$name.log"; exit 1; fi
}

trl_run uniform --credit uniform
trl_run datc --credit '{"name": "datc", "beta": 1.0, "lam": 0.5}'
trl_run datc_lora --credit datc --use_peft true --lora_target_modules q_proj v_proj

echo "== TRL: checking the logged credit diagnostics"
"$PYTHON" - "$WORK" <<'EOF'
import ast, os, sys

work = sys.argv[1]

def logged(name):
    rows = []
    for line in open(os.path.join(work, f"trl_{name}.log")):
        if line.startswith("{'loss'"):
            rows.append({k: float(v) for k, v in ast.literal_eval(line.strip()).items()})
    assert rows, f"trl_{name}.log: no metrics logged"
    return rows

for name in ("uniform", "datc", "datc_lora"):
    rows = logged(name)
    assert all("credit/weight_max" in r for r in rows), f"{name}: credit metrics missing"
    print(f"{name:10s} steps={len(rows)} weight_max={rows[-1]['credit/weight_max']:.3f} "
          f"entropy={rows[-1]['credit/weight_entropy']:.3f} step_time={rows[-1]['step_time']:.3f}")
assert all(r["credit/weight_max"] == 1.0 for r in logged("uniform")), "uniform: w = 1"
for name in ("datc", "datc_lora"):
    assert max(r["credit/weight_max"] for r in logged(name)) > 1.0, f"{name}: uneven weights"
print("TRL SMOKE OK")
EOF
