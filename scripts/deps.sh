#!/usr/bin/env bash
# Installs the Debian packages meshtrain needs (apt-get, as root); otherwise prints the exact
# apt-get line and fails. Usage: scripts/deps.sh run|test|bench (test adds the reference checks,
# bench the peer libraries that bench/comm_vs_peers times against).
set -euo pipefail
# libc6-dev: gcc without recommends lacks the C library's headers and start files.
# liburing-dev: the offload engine's io_uring (optional: without it, or where the kernel
# refuses io_uring, the engine uses pread/pwrite).
packages=(cmake make gcc libc6-dev libopenblas-openmp-dev libjansson-dev libxxhash-dev bible-kjv
          liburing-dev)
if [ "${1:-run}" = test ]; then
  # PyTorch and numpy for the parity test and benchmarks; clang and its sanitizer runtime
  # for the ASan/UBSan build of the suite; Open MPI (library and mpirun) for the mpi back end
  # and its tests; iproute2 (ip netns) for the hier test across network namespaces; libomp-14-dev
  # for clang's omp.h (the runtime stays libgomp, -fopenmp=libgomp); slurm-wlm and munge for
  # the slurm test's private cluster (its daemons are started by the test, never as services);
  # MPICH (mpicc.mpich, mpiexec.mpich) for the mpi_engines test's second build (Open MPI stays
  # the default MPI). nodejs and npm: the tokenizer's GPT-2 parity test installs the npm package
  # gpt-3-encoder into a scratch folder and runs it as the reference; NodeSource's nodejs
  # carries its own npm and conflicts with Debian's, so npm is asked for only where no npm
  # command exists. chromium: the report test loads `meshtrain report`'s page headless and
  # checks its plots in the DOM, keeping a screenshot.
  packages+=(python3-torch python3-numpy clang libclang-rt-14-dev libomp-14-dev iproute2 openmpi-bin libopenmpi-dev
             slurm-wlm munge mpich libmpich-dev nodejs chromium)
  command -v npm > /dev/null || packages+=(npm)
elif [ "${1:-run}" = bench ]; then
  # Open MPI (mpicc, mpirun) and PyTorch's gloo: the all-reduce peers of bench/comm_vs_peers;
  # iproute2 (ip netns, tc): scripts/slow_net.sh's rate-limited hosts; valgrind: callgrind's
  # instruction counts in bench/accounting_overhead.
  packages+=(openmpi-bin libopenmpi-dev python3-torch python3-numpy iproute2 valgrind)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
line="apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" != 0 ]; then
  echo "meshtrain needs these Debian packages: ${missing[*]}" >&2
  echo "run as root:  apt-get update && $line" >&2
  exit 1
fi
echo "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
$line
