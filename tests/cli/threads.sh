#!/usr/bin/env bash
# Threads per rank end to end: ranks bound with taskset or by the launcher, srun's variables
# set by hand, and mpirun without binding each get their CPUs over the ranks sharing them, in
# summary.json and the log; OMP_NUM_THREADS and --threads win; SLURM_CPUS_PER_TASK caps; a
# bad OMP_NUM_THREADS is refused by name.
# Usage: bash tests/cli/threads.sh path/to/meshtrain [mpiexec]   (about 3 s in Release on 2 cores)
set -u

if [[ $# -lt 1 || ! -x $1 ]]; then
    echo "usage: $0 path/to/meshtrain [mpiexec]" >&2
    exit 2
fi
MT=$1
MPIEXEC=${2:-}
WORK=$(mktemp -d /tmp/mt_threads_test.XXXXXX) || exit 2
trap 'rm -rf -- "$WORK"' EXIT
export MT_COMM_TIMEOUT=20 # a bug must fail a case, never hang the suite
unset OMP_NUM_THREADS SLURM_CPUS_PER_TASK RANK WORLD_SIZE LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT
unset MT_JOB_SECRET MT_STORE_HOSTED MT_INJECT_FAULT

passed=0
failed=0
pass() { passed=$((passed + 1)); echo "ok: $1"; }
fail() { failed=$((failed + 1)); echo "FAIL: $1"; [[ -f $WORK/log ]] && tail -5 "$WORK/log"; }

cpus=$(nproc)
half=$((cpus / 2 > 0 ? cpus / 2 : 1))

for i in $(seq 300); do echo "In the beginning was the word, line $i of the tiny corpus."; done \
    >"$WORK/text.txt"
"$MT" data text "$WORK/text.txt" --out "$WORK/corpus" >/dev/null 2>&1 || {
    echo "FAIL setup: meshtrain data text"
    exit 1
}
TINY=(--data "$WORK/corpus" --steps 2 --layers 1 --width 16 --heads 2 --context 8 --batch 4
    --sample_tokens 0 --eval_every 0 --out "$WORK/run")

# summary_has WANT...: each WANT (a JSON piece such as '"threads": 1,') is in summary.json.
summary_has() {
    local piece
    for piece in "$@"; do
        grep -qF -- "$piece" "$WORK/run/summary.json" 2>/dev/null || return 1
    done
}

# check LABEL THREADS SOURCE RANKS: the run in $WORK/log succeeded and its summary.json and
# log say THREADS threads from SOURCE, and every rank's figures are RANKS ("1, 1").
check() {
    if [[ $status -ne 0 ]]; then
        fail "$1: exit status $status"
    elif ! summary_has "\"threads\": $2," "\"threads_source\": \"$3\"" \
        "\"rank_threads\": [$4]"; then
        fail "$1: summary.json: $(grep -o '"threads[^,]*,[^,]*,' "$WORK/run/summary.json" 2>/dev/null) $(grep -o '"rank_threads": [^]]*]' "$WORK/run/summary.json" 2>/dev/null), want $2 from $3, ranks [$4]"
    elif ! grep -qF "; $2 threads ($3);" "$WORK/log"; then
        fail "$1: the log lacks '$2 threads ($3)'"
    else
        pass "$1: $2 threads ($3), ranks [$4]"
    fi
}

run() {
    rm -rf "$WORK/run"
    timeout 60 "$@" >"$WORK/log" 2>&1
    status=$?
}

# Both ranks confined to CPU 0: they share it.
run taskset -c 0 "$MT" train --nproc 2 "${TINY[@]}"
check "taskset -c 0, train --nproc 2" 1 "affinity/2 local ranks" "1, 1"

# All CPUs shared by the two ranks.
run "$MT" train --nproc 2 "${TINY[@]}"
check "train --nproc 2" "$half" "affinity/2 local ranks" "$half, $half"

# The launcher binds each rank to a core of its own: not divided again.
if [[ $cpus -ge 2 ]]; then
    run "$MT" launch --nproc-per-node 2 --bind-to-core -- "$MT" train "${TINY[@]}"
    check "launch --bind-to-core" 1 "affinity/1 local rank" "1, 1"
fi

# srun's variables by hand (no meshtrain launcher, no LOCAL_WORLD_SIZE): rank 0 hosts the store.
port=$((20000 + RANDOM % 20000))
rm -rf "$WORK/run"
pids=()
for r in 0 1; do
    SLURM_PROCID=$r SLURM_NTASKS=2 SLURM_LOCALID=$r SLURM_TASKS_PER_NODE=2 SLURM_JOB_ID=7 \
        MASTER_ADDR=127.0.0.1 MASTER_PORT=$port MT_JOB_SECRET=threads-test-secret-0123456789 \
        timeout 60 "$MT" train "${TINY[@]}" >"$WORK/slurm.$r" 2>&1 &
    pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
    wait "$pid" || status=$?
done
cp "$WORK/slurm.0" "$WORK/log"
check "srun variables" "$half" "affinity/2 local ranks" "$half, $half"

# mpirun that binds nothing: the ranks share every CPU.
if [[ -n $MPIEXEC ]]; then
    run "$MPIEXEC" --allow-run-as-root --bind-to none -n 2 "$MT" train "${TINY[@]}"
    check "mpirun --bind-to none" "$half" "affinity/2 local ranks" "$half, $half"
fi

# The user's figure wins: OMP_NUM_THREADS, then --threads over it.
OMP_NUM_THREADS=3 run "$MT" train --nproc 2 "${TINY[@]}"
check "OMP_NUM_THREADS=3" 3 "OMP_NUM_THREADS" "3, 3"
OMP_NUM_THREADS=3 run "$MT" train --nproc 2 --threads 2 "${TINY[@]}"
check "--threads 2 over OMP_NUM_THREADS=3" 2 "--threads" "2, 2"

# Slurm's grant caps the default.
if [[ $cpus -ge 2 ]]; then
    SLURM_CPUS_PER_TASK=1 run "$MT" train "${TINY[@]}"
    check "SLURM_CPUS_PER_TASK=1" 1 "SLURM_CPUS_PER_TASK" "1"
fi

# A figure that is not one: refused by name.
OMP_NUM_THREADS=lots run "$MT" train "${TINY[@]}"
if [[ $status -ne 1 ]]; then
    fail "OMP_NUM_THREADS=lots: exit status $status, want 1"
elif ! grep -qF "OMP_NUM_THREADS='lots'" "$WORK/log"; then
    fail "OMP_NUM_THREADS=lots: the message does not name it"
else
    pass "OMP_NUM_THREADS=lots refused by name"
fi

echo "threads: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
