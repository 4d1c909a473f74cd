#!/usr/bin/env bash
# T7 and T8: runs every fuzz target that has a seed corpus
# (fuzz/corpus/<target>/) for FUZZ_SECONDS (the stateful action fuzzer, T8,
# for twice that) and prints its figure as one RELIABILITY line. New inputs
# go to build/fuzz/corpus/<target>/; the committed seeds are only read. Exits
# non-zero when a target crashed, leaving the reproducer in
# build/fuzz/artifacts/<target>/ (rerun it: build/fuzz/fuzz/<target> <file>).
# Each target is one libFuzzer process on one thread, so FUZZ_JOBS of them
# (default: one per CPU) run at once, the longest first; the lines are printed
# in target order once all have ended.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build/fuzz
seconds=${FUZZ_SECONDS:-60}
jobs=${FUZZ_JOBS:-$(nproc)}
if ! [[ "$jobs" =~ ^[1-9][0-9]*$ ]]; then
  echo "fuzz: FUZZ_JOBS='$jobs' is not a positive whole number of targets to run at once" >&2
  exit 2
fi
failed=0

stat() { sed -n "s/^stat::$1: *//p" "$2" | tail -1; }
last() { grep -o "$1: [0-9]*" "$2" | tail -1 | cut -d' ' -f2; }
test_id() { if [ "$1" = fuzz_endpoint_actions ]; then echo T8; else echo T7; fi; }

# Runs one target to its end and leaves libFuzzer's exit code beside its log.
fuzz_one() {
  local target=$1 run_seconds=$seconds
  local bin=$build/fuzz/$target work=$build/corpus/$target artifacts=$build/artifacts/$target/
  local log=$build/logs/$target.log
  if [ "$(test_id "$target")" = T8 ]; then run_seconds=$((2 * seconds)); fi
  mkdir -p "$work" "$(dirname "$log")"
  rm -f "$log.rc"  # no exit code on record reads as a failure
  rm -rf "$artifacts" && mkdir -p "$artifacts"  # crashes= counts this run's only
  "$bin" -max_total_time="$run_seconds" -print_final_stats=1 -timeout=25 -artifact_prefix="$artifacts" \
    "$work" "$root/fuzz/corpus/$target/" >"$log" 2>&1
  echo $? >"$log.rc"
}

targets=()
longest_first=()  # T8 runs twice as long: started first, it ends with the rest
for seeds in "$root"/fuzz/corpus/*/; do
  target=$(basename "$seeds")
  if [ ! -x "$build/fuzz/$target" ]; then
    echo "fuzz: no binary $build/fuzz/$target for the corpus $seeds" >&2
    failed=1
    continue
  fi
  targets+=("$target")
  if [ "$(test_id "$target")" = T8 ]; then
    longest_first=("$target" "${longest_first[@]}")
  else
    longest_first+=("$target")
  fi
done

running=0
for target in "${longest_first[@]}"; do
  if [ "$running" -ge "$jobs" ]; then
    wait -n
    running=$((running - 1))
  fi
  fuzz_one "$target" &
  running=$((running + 1))
done
wait

for target in "${targets[@]}"; do
  log=$build/logs/$target.log
  artifacts=$build/artifacts/$target/
  rc=$(cat "$log.rc" 2>/dev/null || echo 1)
  crashes=$(find "$artifacts" -type f | wc -l)
  if [ "$rc" -ne 0 ] && [ "$crashes" -eq 0 ]; then crashes=1; fi  # died without writing a reproducer
  execs=$(stat number_of_executed_units "$log")
  rate=$(stat average_exec_per_sec "$log")
  edges=$(last cov "$log")
  corpus=$(last corp "$log")
  echo "RELIABILITY $(test_id "$target") target=$target execs=${execs:-0} exec_per_s=${rate:-0} edges=${edges:-0}" \
    "corpus=${corpus:-0} crashes=$crashes"
  if [ "$crashes" -ne 0 ]; then
    failed=1
    tail -n 40 "$log" >&2
  fi
done
exit $failed
