# Shared by the GPU smoke scripts (scripts/gpu_smoke.sh, scripts/verl_gpu_smoke.sh):
#   result NAME STATUS   prints "PASS NAME" or "FAIL NAME (log: ...)", counts them in PASSED and
#                        FAILED
#   skip NAME REASON     prints "SKIP NAME (REASON)", counts it in SKIPPED
#   wanted NAME          true unless $ONLY is set and does not name NAME
#   logged NAME CMD...   runs CMD under $RUN_TIMEOUT with its output in $WORK/NAME.log, says
#                        how long it took, shows the log's tail on failure, returns CMD's status
#   missing_modules PY MODULE...   prints the MODULEs that python PY cannot find (space-separated,
#                        nothing when all are there), without importing them; fails when PY
#                        does not run
# Needs WORK and RUN_TIMEOUT set by the sourcing script.
FAILED=0
PASSED=0
SKIPPED=0
result() {
  if [[ $2 -eq 0 ]]; then
    echo "PASS $1"
    PASSED=$((PASSED + 1))
  else
    echo "FAIL $1 (log: $WORK/$1.log)"
    FAILED=$((FAILED + 1))
  fi
}
skip() {
  echo "SKIP $1 ($2)"
  SKIPPED=$((SKIPPED + 1))
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
missing_modules() {
  local py=$1; shift
  "$py" -c 'import importlib.util, sys
print(" ".join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))' "$@"
}
