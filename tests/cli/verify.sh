#!/usr/bin/env bash
# `meshtrain verify` end to end: tp and pp layouts pass and print the report, validation losses
# are compared, a zero tolerance fails naming what, a failing and a timed-out run are reported,
# bad input is refused, --keep keeps the runs (the logged command reads back as a shell
# command), SIGINT stops verify and its layout run, leaving nothing, an ignored SIGHUP stays
# ignored, and nothing (process, temporary folder) is left behind.
# Usage: bash tests/cli/verify.sh path/to/meshtrain   (about 7 s in Release on 2 cores)
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

source "$(dirname "$0")/verify_lib.sh"

# 1-2. Layouts that train the same model as one process.
run 0 --nproc 2 --tp 2 --steps 4
has "verify: dp 1 x pp 1 x tp 2 (2 ranks)" "4 steps of a 4-layer GPT" \
    "losses:     largest relative difference" "parameters: largest relative difference by norm" \
    "ok: both within the tolerance 1e-05"
[[ -z $problem ]] && ! grep -qE '^parameters: .* [0-9]\.[0-9]{2}e[-+][0-9]+ \(' "$WORK/out" &&
    problem="the parameters' difference is not written with 3 digits (%.2e)"
verdict "tp 2 passes"

run 0 --nproc 2 --pp 2 --steps 3
has "verify: dp 1 x pp 2 x tp 1 (2 ranks)" "schedule 1f1b, 4 micro-batches" "losses:" \
    "parameters:" "ok: both within the tolerance 1e-05"
verdict "pp 2 passes"

run 0 --nproc 2 --tp 2 --steps 4 --eval_every 2
has "of 4 training and 2 validation losses" "ok: both within the tolerance 1e-05"
verdict "validation losses compared"

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
# (--dry-run: should train ever accept the layout, it prints the mesh instead of training)
train_message=$(timeout 60 "$MT" train --nproc 3 --tp 2 --dry-run 2>&1 >/dev/null |
    sed -n 's/^meshtrain train: error: //p')
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
# SIGCHLD ignored by the caller would have the kernel reap the runs, their exit status lost.
MT_INJECT_FAULT=nan_loss@1:2 run_as 1 bash -c 'trap "" CHLD; exec "$@"' bash -- --nproc 2 \
    --steps 3 --timeout 30
has "the layout run failed (exit status 1)"
verdict "a failing layout run, SIGCHLD ignored by the caller"
run 1 --nproc 2 --tp 2 --steps 1000000 --timeout 3
has "the reference run did not finish within 3 s; the last lines of" "| step "
verdict "a run past the timeout"

# 6. --keep keeps both runs and the corpus, which --data can then reuse. A log's first line, the
# run's command, reads back in a shell as the same arguments, a prompt with ' $ ( and spaces
# included.
prompt="it's \$HOME (a test)"
run 0 --nproc 2 --steps 2 --prompt "$prompt" --keep "$WORK/kept"
has "the runs are in $WORK/kept"
for file in reference/model.safetensors layout/metrics.jsonl reference.log layout.log \
    data/train.bin data/val.bin; do
    [[ -z $problem && ! -s $WORK/kept/$file ]] && problem="--keep did not keep $file"
done
command_line=$(head -n 1 "$WORK/kept/layout.log")
words=()
[[ -z $problem ]] && ! eval "words=(${command_line#'# '})" 2>/dev/null &&
    problem="the logged command is no shell command: $command_line"
[[ -z $problem && ${words[1]:-} != train ]] && problem="the logged command is not train's"
[[ -z $problem ]] && ! printf '%s\n' "${words[@]}" | grep -qxF -- "$prompt" &&
    problem="the logged command lost the prompt: $command_line"
verdict "--keep keeps the runs, the command reads back"
run 0 --nproc 2 --zero 1 --steps 2 --data "$WORK/kept/data"
has "zero 1" "ok: both within the tolerance"
verdict "--data reuses a corpus"

# 7. Signals. start_verify TMP PREFIX... -- ARGS...: `PREFIX... meshtrain verify ARGS` in the
# background under timeout (PREFIX sets up signals, then execs), TMPDIR=TMP, output in
# $WORK/out; returns once verify has printed its plan, with $waiter (timeout) and $verify (its
# child: verify, once PREFIX has exec'd it).
start_verify() {
    local tmp=$1
    shift
    take_prefix "$@"
    mkdir -p "$tmp"
    TMPDIR=$tmp timeout 60 "${prefix[@]}" "$MT" verify "${args[@]}" >"$WORK/out" 2>&1 &
    waiter=$!
    verify=""
    wait_for "$WORK/out" "verify: dp " && verify=$(pgrep -P "$waiter")
    [[ -z $verify ]] && problem="verify did not start"
}

# wait_for FILES PHRASE: waits (up to 60 s) until one of FILES (a pattern) holds PHRASE.
wait_for() {
    local _
    for _ in $(seq 1200); do
        grep -qsF -- "$2" $1 && return 0
        sleep 0.05
    done
    return 1
}

# SIGINT while the layout run (2 ranks) trains: verify stops it and dies by SIGINT (130 to bash,
# so that a shell loop stops too), no process of the run remains, its work folder is gone. A
# background job of a script inherits SIGINT ignored: env gives verify the default, as a
# terminal's Ctrl-C finds it.
problem=""
start_verify "$WORK/int" env --default-signal=INT -- --nproc 2 --steps 400
if [[ -z $problem ]] && ! wait_for "$WORK/int/*/layout.log" "step 1/"; then
    problem="the layout run did not start"
fi
[[ -n $verify ]] && kill -INT "$verify"
wait "$waiter"
status=$?
[[ -z $problem && $status -ne 130 ]] && problem="exit status $status, want 130 (SIGINT)"
has "Interrupt: stopping the layout run"
pgrep -f -- "$WORK/int" >/dev/null && problem="runs still going: $(pgrep -af -- "$WORK/int")"
[[ -z $problem && -n $(ls -A "$WORK/int") ]] && problem="left in TMPDIR: $(ls -A "$WORK/int")"
verdict "SIGINT stops the layout run and verify, leaving nothing"

# SIGHUP ignored by the caller (nohup) stays ignored: verify and its runs go on to the report.
problem=""
start_verify "$TMPDIR" bash -c 'trap "" HUP; exec "$@"' bash -- --nproc 2 --steps 100
if [[ -z $problem ]] && ! wait_for "$TMPDIR/*/reference.log" "step 1/"; then
    problem="the reference run did not start"
fi
[[ -n $verify ]] && kill -HUP "$verify"
wait "$waiter"
status=$?
[[ -z $problem && $status -ne 0 ]] && problem="exit status $status, want 0"
has "ok: both within the tolerance"
verdict "an ignored SIGHUP does not stop verify"

# Nothing left: no temporary folder, no run still going.
problem=""
[[ -n $(ls -A "$TMPDIR") ]] && problem="left in TMPDIR: $(ls -A "$TMPDIR")"
pgrep -f -- "$WORK" >/dev/null && problem="runs still going: $(pgrep -af -- "$WORK")"
: >"$WORK/out"
verdict "nothing left behind"

echo "verify.sh: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
