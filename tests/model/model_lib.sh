# Sourced by the tests/model/check_*model.sh scripts: the tool check, one
# verifier run and the fields of pan's report that they all read.

# require_tools <figure line>: spin and gcc are installed, or a FAIL line,
# the figure line, and exit 1.
require_tools() {
  local tool
  for tool in spin gcc; do
    if ! command -v "$tool" >/dev/null; then
      echo "FAIL $tool is not installed (make deps installs it: apt-get install -y $tool)"
      echo "$1"
      exit 1
    fi
  done
}

# verify <dir> <model> <pan options> <spin -D options...>: builds (with
# $CFLAGS_PAN) and runs one verifier of <model> in <dir>, bounded by
# $PAN_MEMORY (pan's -m and -w); its report is <dir>/out.
verify() {
  local dir=$1 model=$2 pan_opts=$3
  shift 3
  mkdir -p "$dir" && cp "$model" "$dir/" || return 1
  # shellcheck disable=SC2086
  (cd "$dir" && spin -a "$@" "$(basename "$model")" >spin.log 2>&1 &&
    gcc -w -DCOLLAPSE $CFLAGS_PAN -o pan pan.c 2>gcc.log && ./pan $pan_opts $PAN_MEMORY >out 2>&1)
  [[ -s $dir/out ]]
}

# field <report> <regex with one group>: the group of its first match.
field() { sed -nE "s/.*$2.*/\\1/p" "$1" | head -1; }

# pan_error <report>: the first error pan reports, without its depth.
pan_error() { grep -m1 -E '^pan:1: ' "$1" | sed -E 's/^pan:1: //; s/ \(at depth [0-9]+\)//'; }

# report_safety <label> <verify's status> <dir>: the clean model's safety
# run, as "ok" with its states, time and memory, or as FAIL with pan's first
# lines (or the spin and gcc logs). Sets states, secs and mb; 1 on FAIL.
report_safety() {
  local label=$1 ran=$2 dir=$3 out=$3/out
  if [[ $ran != 0 ]]; then
    echo "FAIL $label: spin or gcc failed"
    cat "$dir/spin.log" "$dir/gcc.log" 2>/dev/null | head -20 | sed 's/^/     /'
    states=0 secs=0 mb=0
    return 1
  fi
  states=$(field "$out" '^ *([0-9]+) states, stored')
  secs=$(field "$out" 'elapsed time ([0-9.]+)')
  mb=$(field "$out" '^ *([0-9.]+)[[:space:]]+total actual memory usage')
  if [[ $(field "$out" 'errors: ([0-9]+)') == 0 ]] && ! grep -q 'max search depth too small' "$out"; then
    echo "ok   $label: $states states, ${secs} s, ${mb} MB"
    return 0
  fi
  echo "FAIL $label: errors=$(field "$out" 'errors: ([0-9]+)')"
  grep -E '^pan|violated|invalid end|too small' "$out" | head -5 | sed 's/^/     /'
  return 1
}
