#!/usr/bin/env bash
# Builds meshtrain against Open MPI (the default build) and trains under Open MPI's mpirun.
# Copy it and change the ranks and the training flags to your job's.
#
# usage: examples/mpi/openmpi.sh [meshtrain train FLAGS...]
#   NP=4                 ranks (default 4); across hosts add a hostfile to MPIRUN_FLAGS
#   BUILD=build          the build folder (configured here when it has no CMakeCache.txt)
#   MT_COMM_BACKEND=mpi  trains over MPI itself; unset, the ranks meet through MPI and then
#                        talk over shared memory (one host), or tcp/hier (set it) across hosts
#   MPIRUN_FLAGS="..."   more mpirun flags, e.g. "--hostfile hosts" (several hosts also need
#                        MASTER_ADDR: an address of rank 0's host the others reach)
# As root mpirun also wants OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; with
# more ranks than cores, OMPI_MCA_rmaps_base_oversubscribe=1.
set -euo pipefail
source_dir=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD:-$source_dir/build}
np=${NP:-4}

if [[ ! -f $build/CMakeCache.txt ]]; then
    cmake -S "$source_dir" -B "$build" -DCMAKE_BUILD_TYPE=Release -DMPI_C_COMPILER=mpicc.openmpi
fi
cmake --build "$build" --target meshtrain_cli -j "$(nproc)" >/dev/null

# mpirun hands its own environment to the ranks it starts on this host; -x hands these to
# ranks on other hosts too.
forward=()
for name in MT_COMM_BACKEND MASTER_ADDR MASTER_PORT MT_COMM_TIMEOUT; do
    [[ -n ${!name:-} ]] && forward+=(-x "$name")
done
# shellcheck disable=SC2086
exec mpirun.openmpi -n "$np" ${MPIRUN_FLAGS:-} "${forward[@]}" "$build/meshtrain" train "$@"
