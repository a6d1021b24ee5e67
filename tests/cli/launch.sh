#!/usr/bin/env bash
# The launcher end to end: a worker killed at a random moment, exiting, aborting or terminated
# ends the job loudly within seconds with nothing left behind; a stuck rank is named by the
# flight recorder; restarts; output prefixes; signals; meshes; other launchers' variables.
# Usage: bash tests/cli/launch.sh path/to/meshtrain [mpiexec]
set -u

if [[ $# -lt 1 || ! -x $1 ]]; then
    echo "usage: $0 path/to/meshtrain [mpiexec]" >&2
    exit 2
fi
MT=$1
MPIEXEC=${2:-}
WORK=$(mktemp -d /tmp/mt_launch.XXXXXX) || exit 2
trap 'rm -rf -- "$WORK"' EXIT
export MT_COMM_TIMEOUT=20 # a bug must fail a case, never hang the suite
export TMPDIR=$WORK       # the flight recorder folders that failed jobs keep
unset MT_JOB_SECRET MT_JOB_SECRET_FILE RANK WORLD_SIZE MASTER_ADDR MASTER_PORT

passed=0
failed=0
fail() {
    echo "FAIL: $1"
    sed 's/^/    | /' "$WORK/out" | tail -25
    failed=$((failed + 1))
}
pass() {
    echo "ok: $1"
    passed=$((passed + 1))
}

# expect NAME PHRASE...: every phrase (a grep -E pattern) is in $WORK/out.
expect() {
    local name=$1
    shift
    for phrase in "$@"; do
        if ! grep -qE -- "$phrase" "$WORK/out"; then
            fail "$name: output lacks '$phrase'"
            return 1
        fi
    done
    return 0
}

shm_count() { find /dev/shm -maxdepth 1 -name 'mt-*' 2>/dev/null | wc -l; }

# Nothing a worker started may outlive the job: the marker process below is a `sleep` with a
# number no one else uses, started in the background by every worker.
MARKER=31415
leftovers() { pgrep -f "sleep $MARKER" | wc -l; }

# Runs the launcher on 4 workers of `meshtrain check`, each first starting a marker process,
# and times it. Extra arguments go to check.
run_job() {
    local start=$(date +%s%N)
    timeout 60 "$MT" launch --nproc-per-node 4 --grace 2 -- \
        sh -c "sleep $MARKER & exec \"\$0\" check \"\$@\"" "$MT" "$@" >"$WORK/out" 2>&1
    status=$?
    took_ms=$((($(date +%s%N) - start) / 1000000))
}

shm_before=$(shm_count)

# ---- a worker killed from outside at a random moment ----
for attempt in 1 2; do
    start=$(date +%s%N)
    timeout 60 "$MT" launch --nproc-per-node 4 --grace 2 -- \
        sh -c "sleep $MARKER & exec \"\$0\" check --rounds 10000000 --count 64" "$MT" \
        >"$WORK/out" 2>&1 &
    launcher=$!
    # A sanitizer build starts its workers slowly: wait until all 4 exist, then a random moment.
    victims=()
    for _ in $(seq 150); do
        victims=($(pgrep -P "$(pgrep -P "$launcher")")) # timeout -> meshtrain launch -> workers
        [[ ${#victims[@]} -eq 4 ]] && break
        sleep 0.1
    done
    sleep "0.$((RANDOM % 9 + 3))"
    if [[ ${#victims[@]} -ne 4 ]]; then
        kill "$launcher" 2>/dev/null
        wait "$launcher"
        fail "random SIGKILL: the launcher has ${#victims[@]} workers, not 4"
        continue
    fi
    victim=${victims[$((RANDOM % 4))]}
    victim_rank=$(tr '\0' '\n' <"/proc/$victim/environ" | sed -n 's/^RANK=//p')
    killed_at=$(date +%s%N)
    kill -KILL "$victim"
    wait "$launcher"
    status=$?
    took_ms=$((($(date +%s%N) - killed_at) / 1000000))
    if [[ $status -eq 0 || $status -ge 124 ]]; then
        fail "random SIGKILL of rank $victim_rank: launcher exit status $status"
    elif ((took_ms > 10000)); then
        fail "random SIGKILL of rank $victim_rank: launcher took $took_ms ms"
    elif expect "random SIGKILL" "error: rank $victim_rank \(pid $victim on host [^)]*\) was killed by signal 9"; then
        pass "random SIGKILL of rank $victim_rank after $((($killed_at - start) / 1000000)) ms: launcher exited $status in $took_ms ms"
    fi
    sleep 0.2
    [[ $(leftovers) -eq 0 ]] || fail "random SIGKILL: $(leftovers) marker processes left"
done

# ---- a peer's exit code seen before a death by signal: the signal is named ----
# (a killed rank's peers exit 1 after their comm abort, and may be reaped first)
timeout 60 "$MT" launch --nproc-per-node 2 --grace 3 -- \
    sh -c 'if [ "$RANK" = 0 ]; then exit 1; fi; sleep 0.3; kill -KILL $$' >"$WORK/out" 2>&1
status=$?
if [[ $status -eq 0 || $status -ge 124 ]]; then
    fail "exit code then signal: launcher exit status $status"
elif expect "exit code then signal" "error: rank 1 \(pid [0-9]+ on host [^)]*\) was killed by signal 9"; then
    pass "exit code then signal: the launcher names rank 1's SIGKILL, not rank 0's exit code"
fi

# ---- a worker that exits 3, aborts, or is terminated ----
for case in "exit:exited with code 3" "abort:was killed by signal 6" "term:was killed by signal 15" \
            "kill:was killed by signal 9"; do
    how=${case%%:*}
    want=${case#*:}
    run_job --rounds 100000 --count 64 --fail-rank 1 --fail-how "$how" --fail-round 20
    if [[ $status -eq 0 || $status -ge 124 ]]; then
        fail "$how: launcher exit status $status"
    elif ((took_ms > 10000)); then
        fail "$how: launcher took $took_ms ms"
    elif expect "$how" "error: rank 1 \(pid [0-9]+ on host [^)]*\) $want" "^\[1\] rank 1: failing on purpose"; then
        pass "$how: launcher exited $status in $took_ms ms naming rank 1"
    fi
    sleep 0.2
    [[ $(leftovers) -eq 0 ]] || fail "$how: $(leftovers) marker processes left"
done

# ---- a rank that never enters a collective: the others time out, the analysis names it ----
MT_COMM_TIMEOUT=3 run_job --rounds 100000 --count 64 --fail-rank 2 --fail-how hang --fail-round 3
if [[ $status -eq 0 || $status -ge 124 ]]; then
    fail "hang: launcher exit status $status"
elif expect "hang" "did not reach all-reduce #[0-9]+" \
        "flight recorder: comm world \(4 ranks\): ranks 0,1,3 wait in all-reduce #[0-9]+" \
        "rank 2 never entered it"; then
    seq=$(grep -oE 'ranks 0,1,3 wait in all-reduce #[0-9]+' "$WORK/out" | grep -oE '[0-9]+$')
    pass "hang: the analysis names rank 2 and all-reduce #$seq (launcher exited in $took_ms ms)"
fi
[[ $(leftovers) -eq 0 ]] || fail "hang: $(leftovers) marker processes left"

# ---- SIGUSR1 to the launcher: a live analysis; SIGTERM: forwarded, the job ends ----
MT_COMM_TIMEOUT=60 timeout 60 "$MT" launch --nproc-per-node 3 -- "$MT" check --rounds 100000 \
    --count 64 --fail-rank 0 --fail-how hang --fail-round 2 >"$WORK/out" 2>&1 &
launcher=$!
sleep 1.5
kill -USR1 "$(pgrep -P "$launcher")" # timeout would not pass SIGUSR1 on
sleep 2
kill -TERM "$launcher"
wait "$launcher"
status=$?
if [[ $status -eq 0 || $status -ge 124 ]]; then
    fail "SIGUSR1/SIGTERM: launcher exit status $status"
elif expect "SIGUSR1" "flight recorder dumps of the live job" "rank 0 never entered" \
        "error: interrupted by signal 15"; then
    pass "SIGUSR1 printed a live analysis naming the stuck rank; SIGTERM ended the job"
fi

# ---- restarts ----
timeout 60 "$MT" launch --nproc-per-node 3 --max-restarts 2 -- sh -c \
    'if [ "$MT_RESTART_COUNT" = 0 ] && [ "$RANK" = 1 ]; then exit 5; fi; exec "$0" check --tp 3 --heads 6' \
    "$MT" >"$WORK/out" 2>&1
status=$?
if [[ $status -ne 0 ]]; then
    fail "restart: exit status $status"
elif expect "restart" "rank 1 \(pid [0-9]+ on host [^)]*\) exited with code 5" \
        "restarting the job \(1 of 2\)" "^\[2\] rank 2 of 3 .* correct"; then
    pass "restart: a failure on the first attempt, the second succeeds"
fi
timeout 60 "$MT" launch --nproc-per-node 2 --max-restarts 1 -- sh -c 'exit 4' >"$WORK/out" 2>&1
status=$?
if [[ $status -eq 0 ]]; then
    fail "restarts used up: exit status 0"
elif expect "restarts used up" "restarting the job \(1 of 1\)" "exited with code 4 \(no restart left\)"; then
    pass "restarts used up: fails after 1 restart"
fi

# ---- output prefixes, environment, success ----
timeout 60 "$MT" launch --nproc-per-node 2 -- sh -c \
    'echo "env $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR ${#MT_JOB_SECRET}"; printf "no newline"' \
    >"$WORK/out" 2>&1
status=$?
if [[ $status -ne 0 ]]; then
    fail "environment: exit status $status"
elif expect "environment" "^\[0\] env 0 2 0 2 127\.0\.0\.1 64$" "^\[1\] env 1 2 1 2 127\.0\.0\.1 64$" \
        "^\[1\] no newline$"; then
    pass "environment and prefixed output"
fi

# ---- meshes: --dry-run, impossible ones, train --nproc ----
"$MT" train --dry-run --nproc 8 --tp 2 --pp 2 --microbatches 2 --layers 5 --heads 4 --width 64 >"$WORK/out" 2>&1
if expect "dry-run" "mesh: dp 2 x pp 2 x tp 2 = 8 ranks; 5 layers: stage 0 layers 0-2, stage 1 layers 3-4" \
        "^rank 5  dp 1  pp 0  tp 1  host [^ ]+  stage 0  layers 0-2$"; then
    pass "dry-run of dp 2 x pp 2 x tp 2"
fi
for case in "--nproc 6 --tp 4:world of 6 ranks does not divide by tp 4" \
            "--nproc 4 --tp 4 --heads 6 --width 96:tp 4 does not divide the 6 attention heads" \
            "--nproc 4 --pp 4 --layers 3:pp 4 stages need at least 4 layers, the model has 3" \
            "--nproc 4 --dp 3:dp 3 x pp 1 x tp 1 = 3 ranks, but the world has 4"; do
    args=${case%%:*}
    want=${case#*:}
    # shellcheck disable=SC2086
    timeout 60 "$MT" train --dry-run $args >"$WORK/out" 2>&1
    status=$?
    if [[ $status -ne 2 ]]; then
        fail "impossible mesh ($args): exit status $status, want 2"
    elif expect "impossible mesh ($args)" "$want"; then
        pass "impossible mesh ($args) refused: $want"
    fi
done
timeout 60 "$MT" train --nproc 4 --tp 4 --heads 6 --width 96 >"$WORK/out" 2>&1
status=$?
if [[ $status -ne 2 ]] || ! expect "train --nproc" "tp 4 does not divide the 6 attention heads"; then
    [[ $status -ne 2 ]] && fail "train --nproc with a bad mesh: exit status $status, want 2"
else
    pass "train --nproc checks the mesh before starting workers"
fi

# ---- other launchers' variables: torchrun-style and Slurm, rank 0 hosting the store ----
export MT_JOB_SECRET=launch-test-secret-0123456789
port=$((20000 + RANDOM % 20000))
for r in 0 1 2; do
    RANK=$r WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 60 "$MT" check --rounds 2 \
        >"$WORK/torchrun.$r" 2>&1 &
done
wait
cat "$WORK"/torchrun.* >"$WORK/out"
if [[ $(grep -c "correct over 2 rounds" "$WORK/out") -eq 3 ]]; then
    pass "torchrun-style variables: 3 ranks, rank 0 hosting the store"
else
    fail "torchrun-style variables"
fi
job=$((RANDOM % 10000))
for r in 0 1 2 3; do
    SLURM_PROCID=$r SLURM_NTASKS=4 SLURM_LOCALID=$r SLURM_JOB_ID=$job SLURM_NODELIST=localhost \
        SLURM_TASKS_PER_NODE=4 timeout 60 "$MT" check --tp 2 --rounds 2 >"$WORK/slurm.$r" 2>&1 &
done
wait
cat "$WORK"/slurm.* >"$WORK/out"
if [[ $(grep -c "correct over 2 rounds" "$WORK/out") -eq 4 ]]; then
    pass "Slurm variables: 4 ranks, the master from SLURM_NODELIST"
else
    fail "Slurm variables"
fi
unset MT_JOB_SECRET
RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 60 "$MT" check >"$WORK/out" 2>&1
status=$?
if [[ $status -ne 1 ]]; then
    fail "no secret: exit status $status"
elif expect "no secret" "MT_JOB_SECRET"; then
    pass "torchrun-style variables without a secret: refused, naming MT_JOB_SECRET"
fi

# ---- the dump folder: only the recorder's own files are removed; an unsafe folder is refused ----
mkdir -m 700 "$WORK/dumps"
touch "$WORK/dumps/ranking.csv" "$WORK/dumps/rank.txt" "$WORK/dumps/rank0.flight" \
    "$WORK/dumps/rank3.armed.tmp12"
mt_path=$(cd "$(dirname "$MT")" && pwd)/$(basename "$MT")
(cd "$WORK/dumps" && timeout 60 "$mt_path" launch --nproc-per-node 1 --dump-dir . -- true) >"$WORK/out" 2>&1
status=$?
if [[ $status -ne 0 ]]; then
    fail "dump folder cleaning: exit status $status"
elif [[ ! -e $WORK/dumps/ranking.csv || ! -e $WORK/dumps/rank.txt ]]; then
    fail "dump folder cleaning: the user's ranking.csv or rank.txt was removed"
elif [[ -e $WORK/dumps/rank0.flight || -e $WORK/dumps/rank3.armed.tmp12 ]]; then
    fail "dump folder cleaning: an old dump was left"
else
    pass "dump folder cleaning: ranking.csv and rank.txt kept, old dumps removed"
fi
mkdir "$WORK/open" && chmod 777 "$WORK/open"
ln -s "$WORK/dumps" "$WORK/link"
for case in "$WORK/open:is writable by group or others \(mode 0777\)" \
            "$WORK/link:is a symbolic link" "$WORK/link/:is a symbolic link"; do
    dir=${case%%:*}
    want=${case#*:}
    timeout 60 "$MT" launch --nproc-per-node 1 --dump-dir "$dir" -- true >"$WORK/out" 2>&1
    status=$?
    if [[ $status -eq 0 || $status -ge 124 ]]; then
        fail "unsafe --dump-dir $dir: exit status $status"
    elif expect "unsafe --dump-dir $dir" "--dump-dir: flight recorder folder '$dir' $want"; then
        pass "unsafe --dump-dir $dir refused: $want"
    fi
done
if [[ $(id -u) -eq 0 ]]; then # only root can give a folder away
    mkdir -m 700 "$WORK/foreign" && chown 65534 "$WORK/foreign"
    timeout 60 "$MT" launch --nproc-per-node 1 --dump-dir "$WORK/foreign" -- true >"$WORK/out" 2>&1
    status=$?
    if [[ $status -eq 0 || $status -ge 124 ]]; then
        fail "foreign --dump-dir: exit status $status"
    elif expect "foreign --dump-dir" "is owned by uid 65534, not by this user"; then
        pass "a --dump-dir owned by another user is refused"
    fi
fi

# ---- a worker that writes without pause: Ctrl-C still reaches it and ends the job ----
timeout -k 5 60 "$MT" launch --nproc-per-node 1 -- yes >/dev/null 2>"$WORK/out" &
launcher=$!
sleep 1
kill -INT "$(pgrep -P "$launcher")"
wait "$launcher"
status=$?
if [[ $status -eq 0 || $status -ge 124 ]]; then
    fail "SIGINT during '-- yes': launcher exit status $status (not ended by the signal)"
elif expect "SIGINT during '-- yes'" "interrupted by signal 2"; then
    pass "SIGINT during '-- yes' ended the job (exit status $status)"
fi

# ---- mpirun (Open MPI): the same job, bootstrapped through MPI ----
if [[ -n $MPIEXEC ]]; then
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 "$MPIEXEC" --oversubscribe \
        -n 4 "$MT" check --tp 2 --rounds 2 >"$WORK/out" 2>&1
    status=$?
    if [[ $status -ne 0 ]]; then
        fail "mpirun -n 4 meshtrain check: exit status $status"
    elif [[ $(grep -c "correct over 2 rounds" "$WORK/out") -ne 4 ]]; then
        fail "mpirun -n 4 meshtrain check: not 4 ranks correct"
    else
        pass "mpirun --oversubscribe -n 4 meshtrain check --tp 2 (store address through MPI)"
    fi
fi

shm_after=$(shm_count)
if [[ $shm_after -gt $shm_before ]]; then
    echo "FAIL: $((shm_after - shm_before)) shared-memory segments left in /dev/shm"
    failed=$((failed + 1))
fi
echo "launch.sh: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
