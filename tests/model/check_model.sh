#!/usr/bin/env bash
# T1 of the reliability plan: spin checks mailbox.pml, the model of the
# frame/entry hand-off src/ipc/ implements, then each seeded protocol mutant.
# The clean model must show no error in its safety run (assertions, invalid
# end states) nor in `<> done` under weak fairness; every mutant must fail.
# One line per case, then the figure line; exits 1 if any case goes wrong.
#
#   tests/model/check_model.sh            per-commit bounds: R=2 runs, 2 faults
#   MODEL_R=3 MODEL_CHAOS=1 tests/model/check_model.sh   the long tier's safety run
#   (MODEL_LIVE_R and MODEL_LIVE_CHAOS bound the <> done run: 2 runs, 1 fault)
set -uo pipefail

model=$(cd "$(dirname "$0")" && pwd)/mailbox.pml
R=${MODEL_R:-2}
CHAOS=${MODEL_CHAOS:-2}
# The liveness search visits each state up to three times: at these bounds it
# takes seconds, at R=3 over ten minutes.
LIVE_R=${MODEL_LIVE_R:-2}
LIVE_CHAOS=${MODEL_LIVE_CHAOS:-1}
MUTANTS=(PUBLISH_BEFORE_FILL NO_GENERATION_CHECK ACK_BEFORE_COPY RELEASE_KEEPS_FRAME
         SWEEP_BY_STATE STOP_READ_AFTER_SCAN TERMINAL_NOT_LAST NO_ACTIVATION_RESET NO_REPLAY_CHECK
         FRAME_ORDER)

source "$(dirname "$0")/model_lib.sh"
require_tools "RELIABILITY T1 states=0 mutants_caught=0/${#MUTANTS[@]}"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# run <case> <pan options> <spin -D options...>: one verifier, in $work/<case>.
PAN_MEMORY="-m100000 -w26"
run() {
  local dir=$work/$1 pan_opts=$2
  shift 2
  verify "$dir" "$model" "$pan_opts" "$@"
}

status=0
caught=0
start=$SECONDS

CFLAGS_PAN="-O2 -DSAFETY -DNOCLAIM"
run clean "" -DR="$R" -DCHAOS="$CHAOS"
report_safety "clean model, safety (R=$R, $CHAOS faults)" $? "$work/clean" || status=1

CFLAGS_PAN="-O1"
if run live "-a -f -N every_run_ends" -DR="$LIVE_R" -DCHAOS="$LIVE_CHAOS"; then
  out=$work/live/out
  errors=$(field "$out" 'errors: ([0-9]+)')
  if [[ $errors == 0 ]]; then
    echo "ok   clean model, <> done under weak fairness (R=$LIVE_R, $LIVE_CHAOS fault):" \
         "$(field "$out" '^ *([0-9]+) states, stored') states, $(field "$out" 'elapsed time ([0-9.]+)') s"
  else
    echo "FAIL clean model, <> done under weak fairness: errors=${errors:-?}"
    status=1
  fi
else
  echo "FAIL clean model, <> done: spin or gcc failed"
  status=1
fi

# A mutant fails within a second of search: compiling fast matters more.
CFLAGS_PAN="-O0 -DSAFETY -DNOCLAIM"
for m in "${MUTANTS[@]}"; do
  if ! run "$m" "" -DR="$R" -DCHAOS="$CHAOS" -DMUTANT_"$m"; then
    echo "FAIL mutant $m: spin or gcc failed"
    status=1
    continue
  fi
  out=$work/$m/out
  if [[ $(field "$out" 'errors: ([0-9]+)') =~ ^[1-9] ]]; then
    why=$(pan_error "$out")
    echo "ok   mutant $m caught: $why"
    caught=$((caught + 1))
  else
    echo "FAIL mutant $m survived"
    status=1
  fi
done

echo "RELIABILITY T1 states=${states:-0} search_s=${secs:-0} mb=${mb%.*} total_s=$((SECONDS - start))" \
     "mutants_caught=$caught/${#MUTANTS[@]}"
exit $status
