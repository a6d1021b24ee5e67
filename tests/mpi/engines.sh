#!/usr/bin/env bash
# Both MPIs' engines run meshtrain as users start it (examples/mpi/openmpi.sh and mpich.sh):
# Open MPI's mpirun with the default build, MPICH's mpiexec.mpich with a build of its own, each
# with the mpi back end and with the default one, train the same model as `--nproc 4` (losses,
# norms and parameters within 1e-5 relative over 20 steps). A build started by the other MPI's
# launcher is refused naming both; bad input (a layout the world does not divide, ranks on
# several hosts without MASTER_ADDR, a MASTER_PORT already in use) gives one message from
# rank 0, a non-zero exit and no hang under each engine. The MPICH build also runs the
# communicator tests where MPICH behaves unlike Open MPI.
# usage: engines.sh MESHTRAIN MPICH_BUILD_FOLDER   (exit 77: an MPI is not installed)
set -uo pipefail
meshtrain=$1
mpich_build=$2
source "$(dirname "$0")/../train/genesis_setup.sh"
examples=$(cd "$here/../../examples/mpi" && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1

missing=()
command -v mpirun.openmpi >/dev/null || missing+=("Open MPI (openmpi-bin)")
command -v mpiexec.mpich >/dev/null && command -v mpicc.mpich >/dev/null ||
    missing+=("MPICH (mpich libmpich-dev)")
if [[ ${#missing[@]} -eq 2 ]]; then
    echo "skipped: neither MPI is installed"
    exit 77
fi

job=(--data "$scratch/data" --vocab 256 --context 16 --layers 2 --heads 4 --width 64
     --batch 24 --steps 20 --warmup 2 --lr 3e-3 --eval_every 10 --eval_seqs 10
     --sample_tokens 0 --threads 1 --dp 2 --tp 2)
failed=0
fail() {
    echo "FAIL $1"
    [[ -f ${2:-} ]] && sed 's/^/     /' "$2"
    failed=1
}

"$meshtrain" train "${job[@]}" --nproc 4 --out "$scratch/reference" >"$scratch/reference.log" 2>&1 ||
    fail "the --nproc 4 reference run" "$scratch/reference.log"

# equal NAME COMMAND...: the run trains the reference's model.
equal() {
    local name=$1 out="$scratch/${1// /_}"
    shift
    if ! timeout 120 "$@" "${job[@]}" --out "$out" >"$out.log" 2>&1; then
        fail "$name: the run failed" "$out.log"
    elif grep -q 'leaked handle' "$out.log"; then
        fail "$name: MPI reports a leak" "$out.log"
    elif python3 "$here/../train/compare_runs.py" "$scratch/reference" "$out" 1e-5 >"$out.cmp" 2>&1; then
        echo "ok   $name equals --nproc 4"
    else
        fail "$name differs from --nproc 4" "$out.cmp"
    fi
}

# refused NAME PHRASE... -- COMMAND...: a non-zero exit within the timeout, one error line
# (rank 0's) holding every phrase.
refused() {
    local name=$1 phrases=() log="$scratch/refused.log"
    shift
    while [[ $1 != -- ]]; do phrases+=("$1"); shift; done
    shift
    timeout 60 "$@" >"$log" 2>&1
    local status=$? errors
    errors=$(grep -c 'meshtrain train: error:' "$log")
    if [[ $status -eq 0 || $status -eq 124 ]]; then
        fail "$name: exit status $status, want a failure within 60 s" "$log"; return
    elif [[ $errors -ne 1 ]]; then
        fail "$name: $errors error lines, want rank 0's alone" "$log"; return
    fi
    local phrase
    for phrase in "${phrases[@]}"; do
        grep -qF -- "$phrase" "$log" || { fail "$name: the message lacks '$phrase'" "$log"; return; }
    done
    echo "ok   $name: $(grep 'meshtrain train: error:' "$log" | cut -c1-150)"
}

# A port something else already listens on.
python3 -c 'import socket, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
print(s.getsockname()[1], flush=True); time.sleep(600)' >"$scratch/port" &
listener=$!
trap 'kill $listener 2>/dev/null; rm -rf "$scratch"' EXIT
until [[ -s $scratch/port ]]; do sleep 0.1; done
busy_port=$(cat "$scratch/port")

# bad_input LABEL MESHTRAIN RANK_VAR LOCAL_RANK_VAR LOCAL_SIZE_VAR ENGINE...: the three bad
# inputs to a build under its engine (the default back end: the mpi one needs no store). A shell between the
# engine and meshtrain fakes two hosts of two ranks each in the engine's variables.
bad_input() {
    local label=$1 build=$2 rank=$3 local_rank=$4 local_size=$5
    shift 5
    local two_hosts=(sh -c "export $local_size=2 $local_rank=\$(($rank % 2)); exec \"\$0\" \"\$@\"")
    refused "$label: tp 3 on 4 ranks" "tp 3" "the world has 4" -- "$@" "$build" train "${job[@]}" --tp 3
    refused "$label: two hosts without MASTER_ADDR" "span several hosts" "MASTER_ADDR" -- \
        "$@" "${two_hosts[@]}" "$build" train "${job[@]}"
    refused "$label: MASTER_PORT in use" "port is in use" "$busy_port" -- \
        env MASTER_PORT="$busy_port" "$@" "$build" train "${job[@]}"
}

if command -v mpirun.openmpi >/dev/null; then
    equal "mpirun, mpi back end" env MT_COMM_BACKEND=mpi BUILD="$(dirname "$meshtrain")" \
        "$examples/openmpi.sh"
    equal "mpirun, default back end" env BUILD="$(dirname "$meshtrain")" "$examples/openmpi.sh"
    bad_input "mpirun" "$meshtrain" OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_LOCAL_RANK OMPI_COMM_WORLD_LOCAL_SIZE \
        mpirun.openmpi -n 4
fi
if command -v mpiexec.mpich >/dev/null && command -v mpicc.mpich >/dev/null; then
    # The MPICH build, configured and built as the example does, here rather than inside the
    # example's first run, whose 120 s bound is for training, not for compiling the project.
    if [[ ! -f $mpich_build/CMakeCache.txt ]]; then
        cmake -S "$here/../.." -B "$mpich_build" -DCMAKE_BUILD_TYPE=Release \
            -DMPI_C_COMPILER=mpicc.mpich >"$scratch/mpich_build.log" 2>&1
    fi
    cmake --build "$mpich_build" --target meshtrain_cli -j "$(nproc)" >>"$scratch/mpich_build.log" 2>&1 ||
        fail "the MPICH build" "$scratch/mpich_build.log"
    equal "mpiexec.mpich, mpi back end" env MT_COMM_BACKEND=mpi BUILD="$mpich_build" \
        "$examples/mpich.sh"
    equal "mpiexec.mpich, default back end" env BUILD="$mpich_build" "$examples/mpich.sh"
    bad_input "mpiexec.mpich" "$mpich_build/meshtrain" PMI_RANK MPI_LOCALRANKID MPI_LOCALNRANKS mpiexec.mpich -n 4
    # The communicator tests where MPICH differs from Open MPI: truncation reported through
    # MPI_COMM_WORLD's handler (mismatched transfers), aliased buffers refused even when empty
    # (the collective matrix on 2 ranks).
    if cmake --build "$mpich_build" --target test_comm_mpi test_comm_collectives \
           >"$scratch/mpich_tests.log" 2>&1; then
        for run in "test_comm_mpi cases" "test_comm_collectives matrix"; do
            if MT_COMM_BACKEND=mpi timeout 120 mpiexec.mpich -n 2 "$mpich_build/tests/"$run \
                   >"$scratch/mpich_test.log" 2>&1; then
                echo "ok   mpiexec.mpich -n 2 ${run% *}"
            else
                fail "mpiexec.mpich -n 2 $run" "$scratch/mpich_test.log"
            fi
        done
    else
        fail "building the MPICH build's communicator tests" "$scratch/mpich_tests.log"
    fi
    if [[ -x $mpich_build/meshtrain ]] && command -v mpirun.openmpi >/dev/null; then
        for backend in mpi shm; do
            refused "Open MPI build under mpiexec.mpich ($backend)" "built with Open MPI" \
                "MPICH's launcher" "mpicc.mpich" -- env MT_COMM_BACKEND=$backend \
                mpiexec.mpich -n 2 "$meshtrain" train "${job[@]}" --tp 1
            refused "MPICH build under mpirun ($backend)" "built with MPICH" \
                "Open MPI's launcher" "mpicc.openmpi" -- env MT_COMM_BACKEND=$backend \
                mpirun.openmpi -n 2 "$mpich_build/meshtrain" train "${job[@]}" --tp 1
        done
    fi
fi
if [[ ${#missing[@]} -gt 0 ]]; then
    echo "skipped in part: ${missing[*]} not installed"
    [[ $failed -eq 0 ]] && exit 77
fi
echo "took $SECONDS s"
exit $failed
