#!/usr/bin/env bash
# meshtrain configures and builds on a machine without MPI even where one is installed: in a
# private mount namespace every MPI (Open MPI and MPICH: wrappers, launchers, headers,
# libraries, pkg-config files) is hidden, then meshtrain_cli is configured and built in a
# scratch folder; the build must say it has no mpi back end, and its meshtrain must refuse
# `--backend mpi` by name. Debug, not native: the build, not the speed, is under test.
# usage: build_without_mpi.sh SOURCE_DIR   (exit 77: no mount namespaces here, e.g. a chroot)
set -uo pipefail
source_dir=$1
scratch=$(mktemp -d /tmp/mt_no_mpi.XXXXXX) || exit 2
trap 'rm -rf -- "$scratch"' EXIT

if ! unshare -m true 2>/dev/null; then
    echo "skipped: no mount namespace can be made here"
    exit 77
fi

# Runs inside the namespace: hides what exists, then configures and builds.
cat >"$scratch/inside.sh" <<'INSIDE'
set -eu
source_dir=$1 build=$2 empty=$3
lib=/usr/lib/x86_64-linux-gnu include=/usr/include/x86_64-linux-gnu
for d in "$lib/openmpi" "$lib/mpich" "$include/openmpi" "$include/mpich" /etc/openmpi \
         /etc/mpich; do
    [ -d "$d" ] && mount --bind "$empty" "$d"
done
for f in /usr/bin/mpi* /usr/bin/orte* /usr/bin/ompi* /usr/bin/hydra* "$lib"/libmpi* \
         "$lib"/libmpich* "$lib"/libopen-* "$lib"/pkgconfig/mpi* "$lib"/pkgconfig/ompi* \
         "$lib"/pkgconfig/mpich* "$include/mpi"; do
    [ -e "$f" ] && mount --bind /dev/null "$f"
done
if command -v mpicc >/dev/null 2>&1 && mpicc -show >/dev/null 2>&1; then
    echo "an MPI is still visible (mpicc works)" >&2
    exit 1
fi
cmake -S "$source_dir" -B "$build" -DCMAKE_BUILD_TYPE=Debug -DMT_NATIVE=OFF
cmake --build "$build" --target meshtrain_cli -j "$(nproc)"
INSIDE
mkdir -p "$scratch/empty"
if ! nice unshare -m sh "$scratch/inside.sh" "$source_dir" "$scratch/build" "$scratch/empty" \
        >"$scratch/log" 2>&1; then
    echo "FAIL: configuring and building without MPI failed; the end of its log:"
    tail -n 30 "$scratch/log"
    exit 1
fi
if ! grep -q "No MPI library found" "$scratch/log"; then
    echo "FAIL: the configure step did not say it builds without MPI"
    grep -i mpi "$scratch/log" | head
    exit 1
fi
if "$scratch/build/meshtrain" bench comm --backend mpi >"$scratch/out" 2>&1 ||
    ! grep -q "'mpi' is not available" "$scratch/out"; then
    echo "FAIL: the build without MPI does not refuse --backend mpi by name:"
    cat "$scratch/out"
    exit 1
fi
echo "ok: built without MPI ($(grep -c 'Building C object' "$scratch/log") files), mpi refused by name"
