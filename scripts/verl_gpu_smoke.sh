#!/usr/bin/env bash
# GPU smoke check of the verl backend (docs/verl.md): verl's own main_ppo through
# credit-verl, on one GPU, offline (a tiny random Qwen2 policy and a tiny Llama reward model
# built from configs, 16 prompts written to parquet), about 4-7 minutes:
#
#   verl_uniform   algorithm.credit=uniform (verl's own GRPO), vLLM rollout, 2 steps
#   verl_datc      algorithm.credit=datc with the reward model as the direction model: W0
#                  reduced in the FSDP engine's old-log-prob forward, vLLM rollout, 2 steps;
#                  passes when the run ends with status 0 and logs credit/weight_max
#   verl_grpo_red  algorithm.credit=red with the reward model as the direction model: its
#                  prefix rewards scored in the FSDP engine's old-log-prob forward request,
#                  vLLM rollout, 2 steps; passes when the run ends with status 0 and logs
#                  credit/weight_max
#   verl_sp_refused  datc with actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=2
#                  (the key verl's engine reads): passes when credit-verl refuses it at
#                  start-up, naming that key, before any worker starts (seconds)
#
# Each check prints one "PASS name" or "FAIL name" line; the exit status is the number of
# failures. Logs are in $WORK. Where a module below is missing, each check prints
# "SKIP name (needs ...)" instead and the script exits 0 before building anything.
#
# Needs: 1 NVIDIA GPU; a python with CUDA torch, ray, vllm (or sglang: ROLLOUT), flash-attn
# (verl's model config loads the policy with attn_implementation flash_attention_2 unless
# actor_rollout_ref.model.override_config.attn_implementation says otherwise) and verl 0.9.1
# (plus the packages of requirements/verl.txt), with this repository installed (pip install
# --no-deps -e .), so that verl's worker processes load the plugin (verl.plugins entry point).
# Usage:  bash scripts/verl_gpu_smoke.sh
# Env:    PYTHON (python), WORK (a fresh temp dir), RUN_TIMEOUT (seconds per run, 600),
#         ONLY (space-separated check names to run, default all), ROLLOUT (vllm or sglang)
set -uo pipefail

PYTHON=${PYTHON:-python}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=${WORK:-$(mktemp -d /tmp/verl_gpu_smoke.XXXXXX)}
RUN_TIMEOUT=${RUN_TIMEOUT:-600}
ROLLOUT=${ROLLOUT:-vllm}
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
cd "$REPO" || exit 1
mkdir -p "$WORK"
echo "== work dir: $WORK"

# BEGIN SETTINGS (read by tests/backends/verl/test_gpu_smoke.py)
VERL_COMMON=(
  algorithm.adv_estimator=grpo
  "data.train_files=$WORK/data/train.parquet" "data.val_files=$WORK/data/train.parquet"
  data.train_batch_size=4 data.max_prompt_length=64 data.max_response_length=16
  data.dataloader_num_workers=0
  "actor_rollout_ref.model.path=$WORK/policy" actor_rollout_ref.model.use_remove_padding=true
  actor_rollout_ref.actor.ppo_mini_batch_size=4
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8
  actor_rollout_ref.actor.optim.lr=1e-5
  actor_rollout_ref.actor.use_kl_loss=false
  "actor_rollout_ref.rollout.name=$ROLLOUT" actor_rollout_ref.rollout.n=4
  actor_rollout_ref.rollout.tensor_model_parallel_size=1
  actor_rollout_ref.rollout.gpu_memory_utilization=0.3
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8
  actor_rollout_ref.rollout.enforce_eager=true
  "reward.custom_reward_function.path=$WORK/reward.py"
  trainer.n_gpus_per_node=1 trainer.nnodes=1 trainer.total_training_steps=2
  trainer.val_before_train=false trainer.test_freq=-1 trainer.save_freq=-1
  "trainer.logger=[console]" "trainer.default_local_dir=$WORK/ckpt"
)
VERL_UNIFORM=(algorithm.credit=uniform)
VERL_DATC=(algorithm.credit=datc "algorithm.direction={kind:seq_classification,path:$WORK/rm}")
VERL_RED=(algorithm.credit=red "algorithm.direction={kind:seq_classification,path:$WORK/rm}")
VERL_SP=(actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=2)
# END SETTINGS

# shellcheck source=scripts/smoke_checks.sh
source "$(dirname "${BASH_SOURCE[0]}")/smoke_checks.sh"
CHECKS=(verl_uniform verl_datc verl_grpo_red verl_sp_refused)

# ------------------------------------------------------------------------------ preflight
missing=$(missing_modules "$PYTHON" torch verl ray "$ROLLOUT" flash_attn pandas) \
  || { echo "FAIL preflight: $PYTHON does not run"; exit 1; }
if [[ -n $missing ]]; then
  why="needs $missing: not installed"
  [[ " $missing " == *" flash_attn "* ]] \
    && why+="; flash_attn: verl loads the policy with attn_implementation flash_attention_2"
  for name in "${CHECKS[@]}"; do wanted "$name" && skip "$name" "$why"; done
  echo "== 0 passed, 0 failed, $SKIPPED skipped"
  exit 0
fi

# ------------------------------------------------- models, data and reward, from configs
"$PYTHON" - "$WORK" <<'PY' || { echo "FAIL setup"; exit 1; }
import sys
from pathlib import Path

import pandas as pd

from adapters.tiny import TINY_CORPUS, tiny_causal_lm, tiny_seq_classifier, train_bpe_tokenizer

work = Path(sys.argv[1])
tokenizer = train_bpe_tokenizer(TINY_CORPUS, 512)
tokenizer.chat_template = (
    "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}answer: {% endif %}"
)
tiny_causal_lm("qwen2", len(tokenizer)).save_pretrained(work / "policy")
tiny_seq_classifier("llama", len(tokenizer), seed=1).save_pretrained(work / "rm")
for folder in ("policy", "rm"):
    tokenizer.save_pretrained(work / folder)
rows = [
    {
        "data_source": "credit_smoke",
        "prompt": [{"role": "user", "content": TINY_CORPUS[i % len(TINY_CORPUS)]}],
        "reward_model": {"style": "rule", "ground_truth": "e"},
        "extra_info": {"index": i},
    }
    for i in range(16)
]
(work / "data").mkdir(exist_ok=True)
pd.DataFrame(rows).to_parquet(work / "data" / "train.parquet")
(work / "reward.py").write_text(
    "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
    "    return solution_str.count(ground_truth) / max(len(solution_str), 1)\n"
)
PY

# ------------------------------------------------------------------------------ checks
if wanted verl_uniform; then
  logged verl_uniform "$PYTHON" -m backends.verl "${VERL_COMMON[@]}" "${VERL_UNIFORM[@]}"
  result verl_uniform $?
fi
if wanted verl_datc; then
  logged verl_datc "$PYTHON" -m backends.verl "${VERL_COMMON[@]}" "${VERL_DATC[@]}"
  status=$?
  if [[ $status -eq 0 ]] && ! grep -q "credit/weight_max" "$WORK/verl_datc.log"; then
    echo "   no credit/weight_max in the log: the credit did not reach verl's metrics"
    status=1
  fi
  result verl_datc $status
fi
if wanted verl_grpo_red; then
  logged verl_grpo_red "$PYTHON" -m backends.verl "${VERL_COMMON[@]}" "${VERL_RED[@]}"
  status=$?
  if [[ $status -eq 0 ]] && ! grep -q "credit/weight_max" "$WORK/verl_grpo_red.log"; then
    echo "   no credit/weight_max in the log: the credit did not reach verl's metrics"
    status=1
  fi
  result verl_grpo_red $status
fi
if wanted verl_sp_refused; then
  logged verl_sp_refused "$PYTHON" -m backends.verl "${VERL_COMMON[@]}" "${VERL_DATC[@]}" "${VERL_SP[@]}"
  status=$?
  if [[ $status -ne 0 ]] && grep -q "fsdp_config.ulysses_sequence_parallel_size: 2" "$WORK/verl_sp_refused.log"; then
    status=0
  else
    echo "   expected a refusal naming actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size"
    status=1
  fi
  result verl_sp_refused $status
fi

echo "== $PASSED passed, $FAILED failed, $SKIPPED skipped"
exit "$FAILED"
