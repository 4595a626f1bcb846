# Shared by the GPU smoke scripts (scripts/gpu_smoke.sh, scripts/verl_gpu_smoke.sh):
#   result NAME STATUS   prints "PASS NAME" or "FAIL NAME (log: ...)", counts failures in FAILED
#   wanted NAME          true unless $ONLY is set and does not name NAME
#   logged NAME CMD...   runs CMD under $RUN_TIMEOUT with its output in $WORK/NAME.log, says
#                        how long it took, shows the log's tail on failure, returns CMD's status
# Needs WORK and RUN_TIMEOUT set by the sourcing script.
FAILED=0
result() {
  if [[ $2 -eq 0 ]]; then echo "PASS $1"; else echo "FAIL $1 (log: $WORK/$1.log)"; FAILED=$((FAILED + 1)); fi
}
wanted() { [[ -z "${ONLY:-}" || " $ONLY " == *" $1 "* ]]; }
logged() {
  local name=$1; shift
  echo "== $name: $*"
  local start=$SECONDS
  timeout "$RUN_TIMEOUT" "$@" >"$WORK/$name.log" 2>&1
  local status=$?
  echo "   exit $status after $((SECONDS - start)) s"
  [[ $status -eq 0 ]] || tail -n 30 "$WORK/$name.log"
  return $status
}
