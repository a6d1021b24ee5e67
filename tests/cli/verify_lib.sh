# Sourced by the verify tests: running `meshtrain verify` bounded, checking its output, and
# counting the cases. Needs $MT (the binary) and $WORK (a scratch folder); sets $problem.

passed=0
failed=0
problem=""

# take_prefix PREFIX... -- ARGS...: sets the arrays $prefix and $args.
take_prefix() {
    prefix=()
    while [[ $1 != -- ]]; do
        prefix+=("$1")
        shift
    done
    shift
    args=("$@")
}

# run WANT ARGS...: `meshtrain verify ARGS` (bounded), its stdout and stderr in $WORK/out;
# sets $problem when the exit status is not WANT, it crashed, or a sanitizer spoke.
run() {
    run_as "$1" -- "${@:2}"
}

# run_as WANT PREFIX... -- ARGS...: the same as `PREFIX... meshtrain verify ARGS` (PREFIX sets up
# signals, then execs).
run_as() {
    local want=$1
    shift
    take_prefix "$@"
    problem=""
    timeout 120 "${prefix[@]}" "$MT" verify "${args[@]}" >"$WORK/out" 2>&1
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
