#!/usr/bin/env bash
# The long tier of the reliability plan (docs: /work/shared/design/reliability-plan.md),
# run on demand, not per commit: each item prints its RELIABILITY figures and
# one line "<item>: N passed, N failed", so logs read the same everywhere.
#   T11-soak   the soak at 10^6 runs, a chip killed every 10^4 (SIMPLER_SOAK_RUNS,
#              SIMPLER_SOAK_KILL_EVERY override them)
#   T9-stress  the T9 stress binary 20 times over, each with a fresh seed
#   T3-chaos   30 min of random chip kills under load: the 60 s chaos test 30
#              times over, each with a fresh node and seed (a chip's
#              incarnation bits allow 63 replacements, about a minute of kills)
#   T7T8-fuzz  the decoder fuzzers (T7) for 30 min each and the action fuzzer
#              (T8) for 1 h, then their new inputs merged into fuzz/corpus/
#              (commit them: CI clones fresh)
#   M13-model  the long tier of seed 002's Mechanism R model (tests/model/
#              args_capture.pml, issue 13): safety with WouldBlock answers and
#              `<> done` with an expired budget (~4 min, ~0.9 GB; CI runs the
#              per-commit bounds only)
# Usage: scripts/reliability-long.sh [item...]   (default: every item)
# Exit status: 0 when every item passed.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=build/default

[ -f "$BUILD/build.ninja" ] || cmake --preset default >/dev/null
cmake --build --preset default -j "${JOBS:-2}" --target simpler_soak_tests simpler_stress_tests simpler_reliability_chaos_tests >/dev/null || {
  echo "build failed"
  exit 2
}

status=0
# run_gtest <item> <binary> [VAR=value...] [-- gtest args...]
run_gtest() {
  local item=$1 binary=$2
  shift 2
  local envs=() args=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
  [ "${1:-}" = "--" ] && shift
  args=("$@")
  local log
  log=$(mktemp)
  env "${envs[@]}" "$BUILD/tests/$binary" "${args[@]}" >"$log" 2>&1
  local rc=$?
  grep -E '^RELIABILITY ' "$log"
  local passed failed
  passed=$(grep -cE '^\[       OK \] ' "$log")
  failed=$(grep -cE '^\[  FAILED  \] .* \([0-9]+ ms\)$' "$log")
  # A crash or a watchdog kill ends the binary before gtest counts the test.
  if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi
  if [ "$failed" -ne 0 ]; then
    status=1
    echo "--- $item: the failing output ($log) ---"
    grep -vE '^\[       OK \]|^\[ RUN      \]' "$log" | tail -40
  else
    rm -f "$log"
  fi
  echo "$item: $passed passed, $failed failed"
}

items=("$@")
[ ${#items[@]} -eq 0 ] && items=(T11-soak T9-stress T3-chaos T7T8-fuzz M13-model)
for item in "${items[@]}"; do
  case "$item" in
    T11-soak)
      run_gtest "$item" simpler_soak_tests "SIMPLER_SOAK_RUNS=${SIMPLER_SOAK_RUNS:-1000000}" \
        "SIMPLER_SOAK_KILL_EVERY=${SIMPLER_SOAK_KILL_EVERY:-10000}" -- --gtest_filter='Soak.*'
      ;;
    T9-stress)
      run_gtest "$item" simpler_stress_tests -- --gtest_repeat=20
      ;;
    T3-chaos)
      run_gtest "$item" simpler_reliability_chaos_tests SIMPLER_CHAOS_SECONDS=60 -- --gtest_repeat=30
      ;;
    T7T8-fuzz)
      if make -s fuzz FUZZ_SECONDS=1800 >/tmp/simpler-fuzz-long.log 2>&1; then fz_failed=0; else fz_failed=1; status=1; fi
      grep -E '^RELIABILITY ' /tmp/simpler-fuzz-long.log
      for seeds in fuzz/corpus/*/; do
        t=$(basename "$seeds")
        build/fuzz/fuzz/$t -merge=1 "$seeds" "build/fuzz/corpus/$t" >/dev/null 2>&1
      done
      echo "$item: $((1 - fz_failed)) passed, $fz_failed failed"
      ;;
    M13-model)
      log=$(mktemp)
      if ARGS_MODEL_WB=1 ARGS_MODEL_LIVE_TO=1 tests/model/check_args_capture_model.sh >"$log" 2>&1; then
        m_failed=0
        rm -f "$log"
      else
        m_failed=1
        status=1
        echo "--- $item: the failing output ($log) ---"
        grep -v '^ok ' "$log" | tail -40
      fi
      echo "$item: $((1 - m_failed)) passed, $m_failed failed"
      ;;
    *)
      echo "$item: unknown item (known: T11-soak T9-stress T3-chaos T7T8-fuzz M13-model)"
      status=1
      ;;
  esac
done
exit $status
