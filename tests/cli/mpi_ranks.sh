#!/usr/bin/env bash
# Runs a multi-rank test program as the ranks of mpirun (the mpi back end's launcher) at several
# group sizes: for each ARG:N[,N...], `MPIEXEC -n N PROGRAM ARG` once per N. Fails if any run does.
# Usage: bash tests/cli/mpi_ranks.sh MPIEXEC PROGRAM ARG:N[,N...]...
# The environment chooses the back end (MT_COMM_BACKEND=mpi) and mpirun's settings (OMPI_*).
set -u

if [[ $# -lt 3 || ! -x $2 ]]; then
    echo "usage: $0 MPIEXEC PROGRAM ARG:N[,N...]..." >&2
    exit 2
fi
MPIEXEC=$1
PROGRAM=$2
shift 2

failed=0
for spec in "$@"; do
    arg=${spec%%:*}
    sizes=${spec#*:}
    if [[ $arg == "$spec" || ! $sizes =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]]; then
        echo "bad run '$spec': want ARG:N[,N...]" >&2
        exit 2
    fi
    for n in ${sizes//,/ }; do
        start=$(date +%s%N)
        # A hang is a failure of its own run, well inside ctest's timeout.
        timeout 240 "$MPIEXEC" -n "$n" "$PROGRAM" "$arg"
        status=$?
        took_ms=$((($(date +%s%N) - start) / 1000000))
        took=$((took_ms / 1000)).$(printf '%03d' $((took_ms % 1000)))
        if [[ $status -eq 0 ]]; then
            printf '%s, %d ranks: ok (%s s)\n' "$arg" "$n" "$took"
        else
            printf '%s, %d ranks: FAILED (status %d%s, %s s)\n' "$arg" "$n" "$status" \
                "$([[ $status -eq 124 ]] && echo ', timed out')" "$took"
            failed=$((failed + 1))
        fi
    done
done
[[ $failed -eq 0 ]] || echo "$failed run(s) failed"
exit $((failed > 0))
