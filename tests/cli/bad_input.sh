#!/usr/bin/env bash
# Command-line tests of bad input: each must fail cleanly (exit 1 or 2, never a crash) with a
# message naming the problem. Usage: bash tests/cli/bad_input.sh path/to/meshtrain
set -u

if [[ $# -ne 1 || ! -x $1 ]]; then
    echo "usage: $0 path/to/meshtrain" >&2
    exit 2
fi
MT=$1
WORK=$(mktemp -d /tmp/mt_bad_input.XXXXXX) || exit 2
trap 'rm -rf -- "$WORK"' EXIT
export TMPDIR=$WORK # the flight-recorder folders that deliberately failed jobs keep

passed=0
failed=0

# run_case NAME WANT [PHRASE...] -- COMMAND...
# WANT is "error" (exit 1 or 2, message phrases in stderr) or an exact status (for 0 the
# phrases are looked for in stdout, otherwise in stderr).
run_case() {
    local name=$1 want=$2
    shift 2
    local phrases=()
    while [[ $# -gt 0 && $1 != -- ]]; do
        phrases+=("$1")
        shift
    done
    shift
    timeout 60 "$@" >"$WORK/stdout" 2>"$WORK/stderr"
    local status=$? problem=""
    if [[ $want == error ]]; then
        if [[ $status -ge 128 || $status -eq 124 ]]; then
            problem="crashed or timed out (status $status)"
        elif [[ $status -ne 1 && $status -ne 2 ]]; then
            problem="exit status $status, want 1 or 2"
        fi
    elif [[ $status -ne $want ]]; then
        problem="exit status $status, want $want"
    fi
    if [[ -z $problem ]] && grep -qE 'Sanitizer|runtime error:' "$WORK/stderr"; then
        problem="a sanitizer reported an error"
    fi
    local stream="$WORK/stderr"
    [[ $want == 0 ]] && stream="$WORK/stdout"
    if [[ -z $problem ]]; then
        local phrase
        for phrase in "${phrases[@]}"; do
            if ! grep -qF -- "$phrase" "$stream"; then
                problem="output lacks '$phrase'"
                break
            fi
        done
    fi
    if [[ -z $problem ]]; then
        echo "ok   $name"
        passed=$((passed + 1))
    else
        echo "FAIL $name: $problem"
        echo "     command: $*"
        sed 's/^/     stderr: /' "$WORK/stderr" | head -n 5
        failed=$((failed + 1))
    fi
}

# A small corpus (about 11 KB of text) for the cases that need a valid one.
for i in $(seq 1 200); do
    echo "line $i: the quick brown fox jumps over the lazy dog"
done >"$WORK/text.txt"
CORPUS=$WORK/corpus
if ! timeout 60 "$MT" data text "$WORK/text.txt" --out "$CORPUS" >/dev/null 2>"$WORK/stderr" ||
    [[ ! -f $CORPUS/train.bin || ! -f $CORPUS/val.bin ]]; then
    echo "FAIL setup: meshtrain data text could not write a corpus"
    cat "$WORK/stderr"
    echo "bad_input: 0 passed, 1 failed"
    exit 1
fi

# Tiny settings, so that a wrongly accepted input still finishes in a moment.
TINY=(--data "$CORPUS" --steps 1 --layers 1 --width 16 --heads 2 --context 8 --batch 2
    --sample_tokens 0 --eval_every 0 --threads 1 --out "$WORK/run")

# A control: the tiny settings on the good corpus succeed, so the failures below are caused
# by the bad input alone.
run_case "control: a valid tiny run succeeds" 0 "done" -- "$MT" train "${TINY[@]}"

run_case "missing data folder" error "$WORK/no-such-corpus/train.bin" -- \
    "$MT" train "${TINY[@]}" --data "$WORK/no-such-corpus"
run_case "unknown key" error "bogus_key" -- "$MT" train "${TINY[@]}" --bogus_key 3
run_case "heads do not divide width" error "heads" "width" -- \
    "$MT" train "${TINY[@]}" --heads 3 --width 64
run_case "lr not a number" error "lr" "abc" -- "$MT" train "${TINY[@]}" --lr abc
run_case "zero layers" error "layers" -- "$MT" train "${TINY[@]}" --layers 0
run_case "unknown recomputation mode" error "config key 'recompute': 'most' is not none, selective or full" -- \
    "$MT" train "${TINY[@]}" --recompute most
run_case "unknown optimizer" error "config key 'optimizer': 'lamb' is neither adamw nor sgd" -- \
    "$MT" train "${TINY[@]}" --optimizer lamb
# --offload: what a stage does not own, and a folder that is missing, a file or read-only, each
# refused before any worker starts (no "[rank]" prefix: the launcher's own check)
run_case "unknown offload mode" error "config key 'offload': 'disk' is not an offload mode" -- \
    "$MT" train "${TINY[@]}" --offload disk
run_case "offloaded parameters without ZeRO 3" error "config keys 'offload' and 'zero'" \
    "needs ZeRO 3" -- "$MT" train "${TINY[@]}" --nproc 2 --zero 1 --offload params
run_case "offloaded parameters under tp" error "config keys 'offload', 'tp' and 'pp'" -- \
    "$MT" train "${TINY[@]}" --nproc 2 --tp 2 --zero 3 --offload params
run_case "missing offload folder" error "config key 'offload_dir'" "$WORK/no-such-dir" \
    "not an existing folder" -- "$MT" train "${TINY[@]}" --nproc 2 --offload optimizer \
    --offload_dir "$WORK/no-such-dir"
run_case "offload folder that is a file" error "config key 'offload_dir'" "not an existing folder" \
    -- "$MT" train "${TINY[@]}" --offload optimizer --offload_dir "$MT"
run_case "offload with local steps" error "config keys 'offload' and 'local_steps'" -- \
    "$MT" train "${TINY[@]}" --offload optimizer --local_steps 4
run_case "unknown attention kernels" error "config key 'attention': 'flash' is not plain or fused" -- \
    "$MT" train "${TINY[@]}" --attention flash
run_case "fused attention with head size 6, before workers start" error \
    "config key 'attention'" "width 12 / heads 2 is 6" -- \
    "$MT" train "${TINY[@]}" --attention fused --width 12 --heads 2 --nproc 2
run_case "zb1 with fewer micro-batches than stages" error \
    "1 micro-batches cannot fill 2 pipeline stages: the zb1 schedule needs at least pp" -- \
    "$MT" train "${TINY[@]}" --layers 2 --pp 2 --nproc 2 --schedule zb1 --microbatches 1
run_case "zb2 with fewer micro-batches than 2 pp - 1" error \
    "'microbatches' and 'pp': 2 micro-batches cannot fill 2 pipeline stages: the zb2 schedule" -- \
    "$MT" train "${TINY[@]}" --layers 2 --pp 2 --nproc 2 --schedule zb2 --microbatches 2
run_case "zb1 under full recomputation" error \
    "the zb1 schedule's weight-gradient pass reads activations that full recomputation" -- \
    "$MT" train "${TINY[@]}" --layers 2 --pp 2 --nproc 2 --schedule zb1 --recompute full --microbatches 2
# refused by the run plan, before any worker starts
run_case "unknown precision" error "config key 'precision': 'fp8' is not a training precision: fp32, bf16 or fp16" -- \
    "$MT" train "${TINY[@]}" --precision fp8 --nproc 2
run_case "unknown gradient reduction type" error "config key 'grad_reduce': 'fp8' is neither fp32 nor bf16" -- \
    "$MT" train "${TINY[@]}" --grad_reduce fp8 --nproc 2
run_case "a gradient hook with a bf16 reduction" error "config keys 'grad_comm' and 'grad_reduce'" -- \
    "$MT" train "${TINY[@]}" --grad_comm powersgd --grad_reduce bf16 --nproc 2
run_case "control: a valid tiny run in bf16 succeeds" 0 "done" -- "$MT" train "${TINY[@]}" --precision bf16
run_case "control: zb1 in bf16 with fused attention succeeds" 0 "done" -- \
    "$MT" train "${TINY[@]}" --layers 2 --pp 2 --nproc 2 --schedule zb1 --microbatches 2 \
    --precision bf16 --attention fused
run_case "fractional layers" error "layers" -- "$MT" train "${TINY[@]}" --layers=1.5
run_case "negative steps" error "steps" -- "$MT" train "${TINY[@]}" --steps -3
run_case "flag without a value" error "seed" -- "$MT" train "${TINY[@]}" --seed
run_case "batch not divisible by microbatches" error "microbatches" -- \
    "$MT" train "${TINY[@]}" --batch 3 --microbatches 2
run_case "missing config file" error "$WORK/no-such.ini" -- \
    "$MT" train "${TINY[@]}" --config "$WORK/no-such.ini"

printf '# a config\nsteps = 1\n\nthis line has no equals sign\n' >"$WORK/broken.ini"
run_case "config line without '='" error "$WORK/broken.ini line 4" -- \
    "$MT" train "${TINY[@]}" --config "$WORK/broken.ini"
printf 'layers = 1\nbogus_key = 3\n' >"$WORK/unknown.ini"
run_case "unknown key in a config file" error "bogus_key" "$WORK/unknown.ini line 2" -- \
    "$MT" train "${TINY[@]}" --config "$WORK/unknown.ini"

mkdir -p "$WORK/truncated"
cp "$CORPUS/val.bin" "$WORK/truncated/val.bin"
cp "$CORPUS/train.bin" "$WORK/truncated/train.bin"
truncate -s -7 "$WORK/truncated/train.bin"
run_case "truncated token file" error "truncated" "$WORK/truncated/train.bin" -- \
    "$MT" train "${TINY[@]}" --data "$WORK/truncated"

mkdir -p "$WORK/magic"
cp "$CORPUS/val.bin" "$CORPUS/train.bin" "$WORK/magic/"
printf 'NOTOKENS' | dd of="$WORK/magic/val.bin" bs=1 seek=0 conv=notrunc status=none
run_case "token file with bad magic" error "magic" "$WORK/magic/val.bin" -- \
    "$MT" train "${TINY[@]}" --data "$WORK/magic"

mkdir -p "$WORK/tiny"
head -c 5 "$WORK/text.txt" >"$WORK/tiny.txt"
"$MT" data text "$WORK/tiny.txt" --out "$WORK/tiny" >/dev/null 2>&1
run_case "corpus shorter than the context" error "$WORK/tiny/train.bin" "context" -- \
    "$MT" train "${TINY[@]}" --data "$WORK/tiny"

run_case "vocab smaller than the corpus" error "vocab" -- "$MT" train "${TINY[@]}" --vocab 100

run_case "data text of a missing file" error "$WORK/no-such.txt" -- \
    "$MT" data text "$WORK/no-such.txt" --out "$WORK/unused"
run_case "data with an unknown source" 2 "bogus" -- "$MT" data bogus
run_case "data text without a file" 2 "FILE" -- "$MT" data text
run_case "data with a bad val fraction" 2 "val-fraction" -- \
    "$MT" data text "$WORK/text.txt" --out "$WORK/unused" --val-fraction 1.5
run_case "unknown command" 2 "nosuchcommand" -- "$MT" nosuchcommand
run_case "no command" 2 "usage" -- "$MT"
run_case "unknown benchmark" 2 "bogus" -- "$MT" bench bogus
run_case "train --help" 0 "usage" "--eval_every" -- "$MT" train --help
run_case "data --help" 0 "usage" -- "$MT" data --help
run_case "bench --help" 0 "usage" -- "$MT" bench --help
# MT_KERNELS names a kernel path: an unknown one stops any command, naming the choices.
run_case "unknown kernel path" 2 "MT_KERNELS=sse9" "avx512bf16" -- env MT_KERNELS=sse9 "$MT" bench gemm
run_case "--help" 0 "usage" -- "$MT" --help

# meshtrain bench comm: bad options are usage errors; tiny runs of every operation check out.
run_case "bench comm --help" 0 "usage" "busbw" -- "$MT" bench comm --help
run_case "bench comm zero ranks" 2 "--nproc" "0" -- "$MT" bench comm --nproc 0
run_case "bench comm unknown op" 2 "--op" "scatterall" -- "$MT" bench comm --op scatterall
run_case "bench comm unknown backend" 2 "--backend" "nccl" -- "$MT" bench comm --backend nccl
run_case "bench comm bad size" 2 "12X" -- "$MT" bench comm --min 12X
run_case "bench comm min above max" 2 "--min" -- "$MT" bench comm --min 1M --max 1K
run_case "bench comm unknown dtype" 2 "f16" -- "$MT" bench comm --dtype f16
run_case "bench comm alltoall in place" 2 "--inplace" -- "$MT" bench comm --op alltoall --inplace
for op in allreduce allgather reducescatter bcast reduce alltoall sendrecv; do
    run_case "bench comm $op, 3 ranks" 0 "check" " ok" -- \
        "$MT" bench comm --nproc 3 --op "$op" --min 8 --max 64K
    inplace=(--inplace)
    [[ $op == alltoall || $op == sendrecv ]] && inplace=()
    run_case "bench comm $op, registered" 0 "registered" " ok" -- \
        "$MT" bench comm --nproc 2 --op "$op" --min 64 --max 256K --registered "${inplace[@]}"
done
# The tcp back end through the same command: small messages and the pipelined large ones.
for op in allreduce allgather reducescatter bcast reduce alltoall sendrecv; do
    run_case "bench comm $op, tcp, 3 ranks" 0 "tcp" " ok" -- \
        "$MT" bench comm --backend tcp --nproc 3 --op "$op" --min 8K --max 128K
done
# The mpi back end: named among the back ends in a build that has it, refused by name in one
# that does not (tests/CMakeLists.txt sets MT_TEST_MPI). A RANK makes bench comm a rank, so
# the library's own choice of back end speaks.
AS_RANK=(env RANK=0 WORLD_SIZE=1 MASTER_PORT=1)
if [[ ${MT_TEST_MPI:-none} == none ]]; then
    run_case "MT_COMM_BACKEND=mpi without mpi" error "unknown communication back end 'mpi'" \
        "this build has" -- "${AS_RANK[@]}" MT_COMM_BACKEND=mpi "$MT" bench comm --max 8
    run_case "bench comm --backend mpi without mpi" 2 "'mpi' is not available" -- \
        "$MT" bench comm --backend mpi
else
    run_case "unknown back end lists mpi" error "unknown communication back end 'nccl'" \
        "mpi)" -- "${AS_RANK[@]}" MT_COMM_BACKEND=nccl "$MT" bench comm --max 8
    run_case "bench comm unknown backend lists mpi" 2 "shm, tcp, mpi" -- \
        "$MT" bench comm --backend nccl
fi
# Ranks of mpirun (the Release build only: Open MPI upsets LeakSanitizer).
if [[ ${MT_TEST_MPI:-none} == run ]]; then
    run_case "bench comm under mpirun without --backend mpi" 2 "pass --backend mpi" -- \
        mpirun -n 1 "$MT" bench comm --max 8
    for op in allreduce allgather reducescatter bcast reduce alltoall sendrecv; do
        run_case "bench comm $op, mpi, 2 ranks" 0 "mpi" " ok" -- \
            "$MT" bench comm --backend mpi --nproc 2 --op "$op" --min 8 --max 64K
    done
    run_case "bench comm under mpirun" 0 "mpi" " ok" -- \
        mpirun -n 2 "$MT" bench comm --backend mpi --op reducescatter --inplace --max 64K
fi

# meshtrain trace merge: usage errors exit 2, bad inputs 1 naming the file and line.
run_case "trace without an action" 2 "usage: meshtrain trace merge" -- "$MT" trace
run_case "trace merge without --out" 2 "needs --out" -- "$MT" trace merge "$WORK/x.json"
run_case "trace merge of a missing file" 1 "/nonexistent.json" -- \
    "$MT" trace merge --out "$WORK/trace_out.json" /nonexistent.json
printf '{"traceEvents":[\n{"ph":"M","pid":0}\n' >"$WORK/cut.rank0.json"
run_case "trace merge of a cut file" 1 "cut.rank0.json" "closing line" -- \
    "$MT" trace merge --out "$WORK/trace_out.json" "$WORK/cut.rank0.json"
printf '],"displayTimeUnit":"ms","meshtrain":{"rank":0,"version":1}}\n' >>"$WORK/cut.rank0.json"
run_case "trace merge of one rank" 0 "wrote" -- \
    "$MT" trace merge --out "$WORK/trace_out.json" "$WORK/cut.rank0.json"

[[ -e $WORK/unused ]] && { echo "FAIL a rejected data command created its output folder"; failed=$((failed + 1)); }

echo "bad_input: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
