#!/usr/bin/env bash
# spin checks doorbell.pml, the model of src/base/doorbell's futex word (the
# count and the asleep bit in one word), then each seeded mutant. The clean
# model must show no error (assertions, invalid end states: a waiter asleep
# for good is a lost wake-up); every mutant must be caught, by a lost
# wake-up. One line per case, then the figure line; exits 1 if any case goes
# wrong.
#
#   tests/model/check_doorbell_model.sh                       2 waiters, 2 ringers, 1 timeout
#   DOORBELL_MODEL_RINGERS=3 tests/model/check_doorbell_model.sh   35M states, ~2 GB
set -uo pipefail

model=$(cd "$(dirname "$0")" && pwd)/doorbell.pml
WAITERS=${DOORBELL_MODEL_WAITERS:-2}
RINGERS=${DOORBELL_MODEL_RINGERS:-2}
TO=${DOORBELL_MODEL_TO:-1}
# mutant: what it breaks
MUTANTS=(
  "LOOK_BEFORE_NEWS|ring_parked() looks for waiters before its news is out"
  "BIT_LOOKED_AT_BEFORE_ADD|a ring reads the bit by a load of its own, then adds"
  "BIT_STORED|a waiter sets the bit by a plain store of what it loaded"
  "WAIT_FORGETS_ARMED|a wait sleeps on the word it finds, not on the one it armed with"
  "BIT_IN_ITS_OWN_WORD|the bit lives apart from the count, so a ring may clear a later waiter's"
)

source "$(dirname "$0")/model_lib.sh"
require_tools "DOORBELL_MODEL states=0 mutants_caught=0/${#MUTANTS[@]}"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# run <case> <spin -D options...>: one safety verifier, in $work/<case>.
CFLAGS_PAN="-O2 -DSAFETY -DNOCLAIM"
PAN_MEMORY="-m200000 -w24"
run() {
  local dir=$work/$1
  shift
  verify "$dir" "$model" "" "$@"
}

status=0
caught=0
start=$SECONDS
bounds="WAITERS=$WAITERS, RINGERS=$RINGERS, TO=$TO"
opts=(-DWAITERS="$WAITERS" -DRINGERS="$RINGERS" -DTO="$TO")

run clean "${opts[@]}"
report_safety "clean model ($bounds)" $? "$work/clean" || status=1

for entry in "${MUTANTS[@]}"; do
  IFS='|' read -r m what <<<"$entry"
  if ! run "$m" "${opts[@]}" -DMUTANT_"$m"; then
    echo "FAIL mutant $m: spin or gcc failed"
    status=1
    continue
  fi
  why=$(pan_error "$work/$m/out")
  if [[ $why == "invalid end state" ]]; then
    echo "ok   mutant $m ($what) caught: a lost wake-up"
    caught=$((caught + 1))
  elif [[ -n $why ]]; then
    echo "FAIL mutant $m caught, but not as a lost wake-up: $why"
    status=1
  else
    echo "FAIL mutant $m ($what) survived"
    status=1
  fi
done

echo "DOORBELL_MODEL states=${states:-0} search_s=${secs:-0} total_s=$((SECONDS - start))" \
     "mutants_caught=$caught/${#MUTANTS[@]}"
exit $status
