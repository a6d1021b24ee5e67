#!/usr/bin/env bash
# ctest train_slow_faults: the slow-rank faults that tests and benchmarks inject
# (MT_INJECT_FAULT=slow_compute@RANK:MS, slow_comm@RANK:MS) slow only the rank named, and change
# nothing the run computes: its losses and final parameters equal a clean run's exactly.
# usage: slow_faults.sh MESHTRAIN
set -uo pipefail
meshtrain=$1
here=$(cd "$(dirname "$0")" && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
export TMPDIR=$scratch
bible -f gen1:1-gen3:24 >"$scratch/text.txt"
"$meshtrain" data text "$scratch/text.txt" --out "$scratch/data" >/dev/null || exit 1
job=(--data "$scratch/data" --vocab 256 --context 16 --layers 2 --heads 2 --width 32 --batch 8
     --microbatches 2 --steps 3 --warmup 1 --eval_every 0 --sample_tokens 0 --threads 1
     --nproc 2)
failed=0
fail() { echo "FAIL $1"; failed=1; }

# run NAME FAULT ARGS...: trains into $scratch/NAME under the fault.
run() {
  local name=$1 fault=$2
  shift 2
  if ! MT_INJECT_FAULT=$fault timeout 120 "$meshtrain" train "${job[@]}" --out "$scratch/$name" \
       "$@" >"$scratch/$name.log" 2>&1; then
    fail "$name: the run failed"
    cat "$scratch/$name.log"
    return 1
  fi
}

# same NAME REFERENCE: NAME's losses and parameters equal REFERENCE's, bit for bit.
same() {
  (cd "$scratch" && python3 "$here/compare_runs.py" "$2" "$1" 0 >/dev/null) ||
    fail "$1 differs from $2"
}

# forward_spans TRACE: the durations (ms) of the forward spans in one rank's Chrome trace.
forward_spans() {
  python3 -c 'import json, sys
events = json.load(open(sys.argv[1]))
events = events["traceEvents"] if isinstance(events, dict) else events
print(" ".join("%.1f" % (e["dur"] / 1000) for e in events if e.get("cat") == "forward"))' "$1"
}

# slowed RANK_TRACE OTHER_TRACE MS: every forward span of the slow rank lasts at least MS, and
# some span of the other rank does not (it is not slowed with it).
slowed() {
  local mine others
  mine=$(forward_spans "$1") others=$(forward_spans "$2")
  [[ -n $mine ]] || { fail "no forward spans in $1"; return; }
  for d in $mine; do
    awk -v d="$d" -v ms="$3" 'BEGIN { exit !(d >= ms) }' || fail "$1: a forward span of $d ms, under $3"
  done
  for d in $others; do
    awk -v d="$d" -v ms="$3" 'BEGIN { exit !(d < ms) }' && return
  done
  fail "$2: every forward span took $3 ms or more, as if slowed too"
}

run clean "" && run clean_pp "" --pp 2 || exit 1

run compute slow_compute@1:120 --trace "$scratch/compute.json" && {
  same compute clean
  slowed "$scratch/compute.rank1.json" "$scratch/compute.rank0.json" 120
  echo "ok   slow_compute@1:120 (dp 2): rank 1's forwards $(forward_spans "$scratch/compute.rank1.json") ms; results equal"
}
run compute_pp slow_compute@1:120 --pp 2 --trace "$scratch/pp.json" && {
  same compute_pp clean_pp
  slowed "$scratch/pp.rank1.json" "$scratch/pp.rank0.json" 120
  echo "ok   slow_compute@1:120 (pp 2): stage 1's forwards $(forward_spans "$scratch/pp.rank1.json") ms; results equal"
}
# Rank 0 sleeps 50 ms before each of its collectives: a step has at least one (the loss
# check), so 3 steps take at least 0.15 s.
start=$(date +%s.%N)
run comm slow_comm@0:50 && {
  same comm clean
  seconds=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  awk -v s="$seconds" 'BEGIN { exit !(s >= 0.15) }' || fail "slow_comm@0:50 ran 3 steps in $seconds s"
  echo "ok   slow_comm@0:50: $seconds s for 3 steps; results equal"
}

if MT_INJECT_FAULT=slow_comm@0:-5 timeout 60 "$meshtrain" train "${job[@]}" --out "$scratch/bad" \
   >"$scratch/bad.log" 2>&1; then
  fail "a negative delay ran"
elif ! grep -q "MT_INJECT_FAULT 'slow_comm@0:-5': -5 milliseconds" "$scratch/bad.log"; then
  fail "a negative delay is not named: $(tail -n 2 "$scratch/bad.log")"
else
  echo "ok   slow_comm@0:-5 refused"
fi
exit $failed
