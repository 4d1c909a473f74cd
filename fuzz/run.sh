#!/usr/bin/env bash
# T7 and T8: runs every fuzz target that has a seed corpus
# (fuzz/corpus/<target>/) for FUZZ_SECONDS (the stateful action fuzzer, T8,
# for twice that) and prints its figure as one RELIABILITY line. New inputs
# go to build/fuzz/corpus/<target>/; the committed seeds are only read. Exits
# non-zero when a target crashed, leaving the reproducer in
# build/fuzz/artifacts/<target>/ (rerun it: build/fuzz/fuzz/<target> <file>).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build/fuzz
seconds=${FUZZ_SECONDS:-60}
failed=0

stat() { sed -n "s/^stat::$1: *//p" "$2" | tail -1; }
last() { grep -o "$1: [0-9]*" "$2" | tail -1 | cut -d' ' -f2; }

for seeds in "$root"/fuzz/corpus/*/; do
  target=$(basename "$seeds")
  bin=$build/fuzz/$target
  work=$build/corpus/$target
  artifacts=$build/artifacts/$target/
  log=$build/logs/$target.log
  if [ ! -x "$bin" ]; then
    echo "fuzz: no binary $bin for the corpus $seeds" >&2
    failed=1
    continue
  fi
  test_id=T7 run_seconds=$seconds
  if [ "$target" = fuzz_endpoint_actions ]; then test_id=T8 run_seconds=$((2 * seconds)); fi
  mkdir -p "$work" "$(dirname "$log")"
  rm -rf "$artifacts" && mkdir -p "$artifacts"  # crashes= counts this run's only
  "$bin" -max_total_time="$run_seconds" -print_final_stats=1 -timeout=25 -artifact_prefix="$artifacts" \
    "$work" "$seeds" >"$log" 2>&1
  rc=$?
  crashes=$(find "$artifacts" -type f | wc -l)
  if [ "$rc" -ne 0 ] && [ "$crashes" -eq 0 ]; then crashes=1; fi  # died without writing a reproducer
  execs=$(stat number_of_executed_units "$log")
  rate=$(stat average_exec_per_sec "$log")
  edges=$(last cov "$log")
  corpus=$(last corp "$log")
  echo "RELIABILITY $test_id target=$target execs=${execs:-0} exec_per_s=${rate:-0} edges=${edges:-0}" \
    "corpus=${corpus:-0} crashes=$crashes"
  if [ "$crashes" -ne 0 ]; then
    failed=1
    tail -n 40 "$log" >&2
  fi
done
exit $failed
