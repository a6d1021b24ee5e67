#!/usr/bin/env bash
# `meshtrain verify` end to end: tp and pp layouts pass and print the report, a zero tolerance
# fails naming what, a failing and a timed-out run are reported, bad input is refused, --keep
# keeps the runs, and nothing (process, temporary folder) is left behind.
# Usage: bash tests/cli/verify.sh path/to/meshtrain   (about 3 s in Release on 2 cores)
set -u

if [[ $# -ne 1 || ! -x $1 ]]; then
    echo "usage: $0 path/to/meshtrain" >&2
    exit 2
fi
MT=$1
WORK=$(mktemp -d /tmp/mt_verify_test.XXXXXX) || exit 2
trap 'rm -rf -- "$WORK"' EXIT
export TMPDIR=$WORK/tmp # verify's temporary folders, so that a leftover one is seen
mkdir -p "$TMPDIR"
unset MT_INJECT_FAULT

passed=0
failed=0
problem=""

# run WANT ARGS...: `meshtrain verify ARGS` (bounded), its stdout and stderr in $WORK/out;
# sets $problem when the exit status is not WANT, it crashed, or a sanitizer spoke.
run() {
    local want=$1
    shift
    problem=""
    timeout 120 "$MT" verify "$@" >"$WORK/out" 2>&1
    local status=$?
    if [[ $status -ne $want ]]; then
        problem="exit status $status, want $want"
    elif grep -qE 'Sanitizer|runtime error:' "$WORK/out"; then
        problem="a sanitizer reported an error"
    fi
}

# has PHRASE...: each phrase must be in the last run's output.
has() {
    local phrase
    for phrase in "$@"; do
        [[ -n $problem ]] && return
        grep -qF -- "$phrase" "$WORK/out" || problem="output lacks '$phrase'"
    done
}

# verdict NAME: counts the case, printing the output of a failed one.
verdict() {
    if [[ -z $problem ]]; then
        echo "ok   $1"
        passed=$((passed + 1))
    else
        echo "FAIL $1: $problem"
        sed 's/^/     | /' "$WORK/out" | tail -n 25
        failed=$((failed + 1))
    fi
}

# 1-2. Layouts that train the same model as one process.
run 0 --nproc 2 --tp 2 --steps 4
has "verify: dp 1 x pp 1 x tp 2 (2 ranks)" "4 steps of a 4-layer GPT" \
    "losses:     largest relative difference" "parameters: largest relative difference by norm" \
    "ok: both within the tolerance 1e-05"
verdict "tp 2 passes"

run 0 --nproc 2 --pp 2 --steps 3
has "verify: dp 1 x pp 2 x tp 1 (2 ranks)" "schedule 1f1b, 4 micro-batches" "losses:" \
    "parameters:" "ok: both within the tolerance 1e-05"
verdict "pp 2 passes"

# 3. tp sums in another order than one process, so its differences are not zero.
run 1 --nproc 2 --tp 2 --steps 2 --tolerance 0
has "FAIL: parameters past the tolerance 0 in" "(verify --keep DIR keeps"
verdict "a zero tolerance fails naming the parameters"

# 4. Bad input: verify's own flags are usage errors (2); a layout the train command refuses is
# refused with its message (1), before anything runs.
run 2 --tolerance abc
has "--tolerance 'abc' is not a number >= 0"
verdict "--tolerance abc"
run 2 --timeout -3
has "--timeout '-3' is not a number of seconds > 0"
verdict "--timeout -3"
run 2 --nproc 2 --keep
has "--keep needs a value"
verdict "--keep without a value"
run 2 --out "$WORK/x"
has "--out: verify puts the runs in its work folder"
verdict "--out refused"
train_message=$("$MT" train --nproc 3 --tp 2 2>&1 >/dev/null | sed -n 's/^meshtrain train: error: //p')
run 1 --nproc 3 --tp 2
has "meshtrain verify: error: ${train_message:-the train command gave no message}"
grep -q "reference run" "$WORK/out" && problem="a run started"
verdict "--nproc 3 --tp 2 refused with train's message"
run 1 --nproc 2 --heads 3 --tp 2 --width 96
has "tp 2 does not divide the 3 attention heads"
verdict "tp not dividing the heads"
run 1 --nproc 2 --data "$WORK/none"
has "--data $WORK/none: cannot read $WORK/none/train.bin"
verdict "a missing corpus"
run 0 --help
has "usage: meshtrain verify" "--tolerance X"
verdict "--help"

# 5. A run that fails (rank 1's loss made NaN: only the layout has a rank 1) is named, with the
# last lines of its log; a run past --timeout is stopped and named.
MT_INJECT_FAULT=nan_loss@1:2 run 1 --nproc 2 --steps 3
has "the layout run failed (exit status 1); the last lines of" "the loss is NaN on rank 1"
verdict "a failing layout run"
run 1 --nproc 2 --tp 2 --steps 1000000 --timeout 1
has "the reference run did not finish within 1 s; the last lines of" "| step "
verdict "a run past the timeout"

# 6. --keep keeps both runs and the corpus, which --data can then reuse.
run 0 --nproc 2 --steps 2 --keep "$WORK/kept"
has "the runs are in $WORK/kept"
for file in reference/model.safetensors layout/metrics.jsonl reference.log layout.log \
    data/train.bin data/val.bin; do
    [[ -z $problem && ! -s $WORK/kept/$file ]] && problem="--keep did not keep $file"
done
verdict "--keep keeps the runs"
run 0 --nproc 2 --zero 1 --steps 2 --data "$WORK/kept/data"
has "zero 1" "ok: both within the tolerance"
verdict "--data reuses a corpus"

# Nothing left: no temporary folder, no run still going.
problem=""
[[ -n $(ls -A "$TMPDIR") ]] && problem="left in TMPDIR: $(ls -A "$TMPDIR")"
pgrep -f -- "$WORK" >/dev/null && problem="runs still going: $(pgrep -af -- "$WORK")"
: >"$WORK/out"
verdict "nothing left behind"

echo "verify.sh: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
