#!/usr/bin/env bash
# Builds meshtrain against MPICH in a build folder of its own and trains under MPICH's
# launcher (Hydra's mpiexec.mpich). Copy it and change the ranks and the training flags.
#
# usage: examples/mpi/mpich.sh [meshtrain train FLAGS...]
#   NP=4                 ranks (default 4)
#   BUILD=build-mpich    the build folder (configured here when it has no CMakeCache.txt)
#   MT_COMM_BACKEND=mpi  trains over MPI itself; unset, the ranks meet through MPI and then
#                        talk over shared memory (one host), or tcp/hier (set it) across hosts
#   MPIEXEC_FLAGS="..."  more mpiexec flags, e.g. "-f hosts" (several hosts also need
#                        MASTER_ADDR: an address of rank 0's host the others reach)
# Hydra hands the whole environment to every rank, on every host.
set -euo pipefail
source_dir=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD:-$source_dir/build-mpich}
np=${NP:-4}

if [[ ! -f $build/CMakeCache.txt ]]; then
    cmake -S "$source_dir" -B "$build" -DCMAKE_BUILD_TYPE=Release -DMPI_C_COMPILER=mpicc.mpich
fi
cmake --build "$build" --target meshtrain_cli -j "$(nproc)" >/dev/null

# shellcheck disable=SC2086
exec mpiexec.mpich -n "$np" ${MPIEXEC_FLAGS:-} "$build/meshtrain" train "$@"
