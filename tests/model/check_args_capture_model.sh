#!/usr/bin/env bash
# Issue 13, part 4: spin checks args_capture.pml, the model of seed 002's
# Mechanism R (slot gate, BEFORE/AFTER barriers, request/ack lines, abort,
# the next occupancy's claim), then each mutant: the five revisions the seed
# withdrew and the extra ones that keep every property tested. The clean model
# must show no error in its safety run (assertions, invalid end states) nor
# in `<> done` under weak fairness; every mutant must be caught, and by the
# property named beside it. One line per case, then the figure line; exits 1
# if any case goes wrong.
#
#   tests/model/check_args_capture_model.sh                per-commit bounds
#   ARGS_MODEL_WB=1 ARGS_MODEL_LIVE_TO=1 tests/model/check_args_capture_model.sh   the long tier
#
# Bounds: 3 cores, ARGS_MODEL_TASKS (2) occupancies, 2 requests per phase,
# ARGS_MODEL_TO (1) expired budgets, ARGS_MODEL_WB (0) WouldBlock answers; the
# liveness run has its own ARGS_MODEL_LIVE_TO (0) and ARGS_MODEL_LIVE_WB (0).
set -uo pipefail

model=$(cd "$(dirname "$0")" && pwd)/args_capture.pml
TASKS=${ARGS_MODEL_TASKS:-2}
TO=${ARGS_MODEL_TO:-1}
WB=${ARGS_MODEL_WB:-0}
LIVE_TO=${ARGS_MODEL_LIVE_TO:-0}
LIVE_WB=${ARGS_MODEL_LIVE_WB:-0}

# mutant, extra spin options, the assertion text (or pan verdict) that must
# catch it, and the property that text is.
MUTANTS=(
  "FIRST_REQUESTER_WINS||sealed\[\(\(n\*2\)\+0\)\]|no execute before the BEFORE seal"
  "AFTER_FIRST_ARRIVER_PUBLISHES|-DTO=0|exec_done|outputs copied only after every participant wrote them"
  "COMPLETE_BEFORE_SEAL||sealed\[\(\(n\*2\)\+1\)\]|no completion before the AFTER seal"
  "SINGLE_CAS_CLAIM||joined\[n\]==0|the claim's clear races no arrival (no arrival bit lost)"
  "LATE_CLAIMER||joined\[n\]==0|the claim's clear races no arrival (no arrival bit lost)"
  "TRUNCATED_IDENTITY||gs==1|no stale ack accepted"
  "ABORT_WRITES_LINE_BACK||r&arrived_g|no arrival bit lost"
  "PHASE_SEQ_IS_TICK||invalid end state|every participant leaves (a peer waits forever on the first request's sequence)"
  "LAST_ARRIVER_BY_RELOAD||npub|one publisher per (occupancy, phase)"
  "SETTLE_ON_SEAL|-DTO=0|departed\[oocc\]==7|no claim of the next occupancy before the last departure"
  "LEAVE_ON_ABORT_FLAG||abort_acked|no participant leaves before the Aborted ack"
  "PEER_READS_STATUS_FIRST||gs==1|no stale ack accepted"
  "PEER_IGNORES_PHASE_SEQ||gs==1|no stale ack accepted"
  "REUSE_BEFORE_DEPARTURE|-DTO=0|invalid end state|a seal outlives its readers (a peer waits forever on a rewritten ack line)"
)
# caught by the liveness run only; pinned to TO=0, where the cycle is found in
# seconds (with one fault the nested search ran past 15 min and 4 GB)
LIVE_MUTANTS=(
  "WOULDBLOCK_FOREVER|-DTO=0|acceptance cycle|<> done under weak fairness"
)
total=$((${#MUTANTS[@]} + ${#LIVE_MUTANTS[@]}))

source "$(dirname "$0")/model_lib.sh"
require_tools "ARGS_CAPTURE_MODEL states=0 mutants_caught=0/$total"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# run <case> <pan options> <spin -D options...>: one verifier, in $work/<case>.
PAN_MEMORY="-m200000 -w24"
run() {
  local dir=$work/$1 pan_opts=$2
  shift 2
  verify "$dir" "$model" "$pan_opts" "$@"
}
complete() { [[ $(field "$1" 'errors: ([0-9]+)') == 0 ]] && ! grep -q 'max search depth too small' "$1"; }

status=0
caught=0
start=$SECONDS
bounds="TASKS=$TASKS, TO=$TO, WB=$WB"

CFLAGS_PAN="-O2 -DSAFETY -DNOCLAIM"
run clean "" -DTASKS="$TASKS" -DTO="$TO" -DWB="$WB"
report_safety "clean model, safety ($bounds)" $? "$work/clean" || status=1

CFLAGS_PAN="-O1"
live_bounds="TASKS=$TASKS, TO=$LIVE_TO, WB=$LIVE_WB"
if run live "-a -f -N every_core_leaves" -DTASKS="$TASKS" -DTO="$LIVE_TO" -DWB="$LIVE_WB"; then
  out=$work/live/out
  if complete "$out"; then
    echo "ok   clean model, <> done under weak fairness ($live_bounds):" \
         "$(field "$out" '^ *([0-9]+) states, stored') states, $(field "$out" 'elapsed time ([0-9.]+)') s"
  else
    echo "FAIL clean model, <> done under weak fairness ($live_bounds): errors=$(field "$out" 'errors: ([0-9]+)')"
    grep -E '^pan|cycle|too small' "$out" | head -5 | sed 's/^/     /'
    status=1
  fi
else
  echo "FAIL clean model, <> done: spin or gcc failed"
  status=1
fi

# check_mutant <entry> <pan options> <bounds...>: a mutant is caught when pan
# reports an error whose first line matches the expected property.
check_mutant() {
  local entry=$1 pan_opts=$2
  shift 2
  local m extra want prop
  IFS='|' read -r m extra want prop <<<"$entry"
  # shellcheck disable=SC2086
  if ! run "$m" "$pan_opts" "$@" $extra -DMUTANT_"$m"; then
    echo "FAIL mutant $m: spin or gcc failed"
    status=1
    return
  fi
  local out=$work/$m/out why
  why=$(pan_error "$out")
  if [[ $(field "$out" 'errors: ([0-9]+)') =~ ^[1-9] ]] && grep -m1 -E '^pan:1: ' "$out" | grep -qE "$want"; then
    echo "ok   mutant $m caught by \"$prop\": $why"
    caught=$((caught + 1))
  elif [[ -n $why ]]; then
    echo "FAIL mutant $m caught, but not by \"$prop\": $why"
    status=1
  else
    echo "FAIL mutant $m survived"
    status=1
  fi
}

# A mutant fails within seconds of search: compiling fast matters more.
CFLAGS_PAN="-O0 -DSAFETY -DNOCLAIM"
for entry in "${MUTANTS[@]}"; do
  # the entry's own -D options come last, so they override these bounds
  check_mutant "$entry" "" -DTASKS="$TASKS" -DTO="$TO" -DWB="$WB"
done
CFLAGS_PAN="-O0"
for entry in "${LIVE_MUTANTS[@]}"; do
  check_mutant "$entry" "-a -f -N every_core_leaves" -DTASKS="$TASKS" -DTO="$LIVE_TO" -DWB="$LIVE_WB"
done

echo "ARGS_CAPTURE_MODEL states=${states:-0} search_s=${secs:-0} mb=${mb%.*} total_s=$((SECONDS - start))" \
     "mutants_caught=$caught/$total"
exit $status
