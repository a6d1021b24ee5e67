#!/usr/bin/env bash
# Training steps allocate nothing once running: each layout trains 3 and then 6 steps under a
# malloc counter (LD_PRELOAD), and every rank of the longer run made exactly as many heap
# allocations as the shorter one's, so the three extra steps made none. (A launcher's store
# answers polls as long as the job runs: it is compared where it is the only process.)
# usage: steady_alloc.sh MESHTRAIN MALLOC_COUNT_SO [SCRATCH]
set -euo pipefail
meshtrain=$1
counter=$2
scratch=${3:-}
source "$(dirname "$0")/genesis_setup.sh"

job=(--data "$scratch/data" --vocab 256 --context 16 --layers 4 --heads 4 --width 64
     --batch 8 --warmup 1 --lr 3e-3 --eval_every 0 --sample_tokens 0 --threads 1
     --save_model off --check_every 1)
# One process, and the multi-rank layouts whose ranks wait on each other every step (shm
# waits long enough to check that their peers are alive).
layouts=("--nproc 1" "--nproc 2 --zero 1" "--nproc 2 --tp 2"
         "--nproc 2 --pp 2 --schedule interleaved --chunks 2 --microbatches 4")

# Total allocations of each rank ("rankN count", in rank order), or of every process when
# none is a launched rank.
counts() {
  local steps=$1 layout=$2 dir="$scratch/count_$1"
  rm -rf "$dir" && mkdir -p "$dir"
  # shellcheck disable=SC2086
  MT_MALLOC_COUNT_DIR="$dir" LD_PRELOAD="$counter" "$meshtrain" train "${job[@]}" $layout \
    --steps "$steps" --out "$scratch/run_$steps" > "$scratch/run_$steps.log" 2>&1 ||
    { echo "FAIL $layout: the run failed" >&2; cat "$scratch/run_$steps.log" >&2; return 1; }
  local files=("$dir"/rank*)
  [ -e "${files[0]}" ] || files=("$dir"/pid*)
  local f
  for f in "${files[@]}"; do echo "$(basename "$f" | sed 's/^pid.*/process/') $(cat "$f")"; done | sort
}

failed=0
for layout in "${layouts[@]}"; do
  short=$(counts 3 "$layout") && long=$(counts 6 "$layout") || { failed=1; continue; }
  if [ -z "$short" ] || [ "$short" != "$long" ]; then
    echo "FAIL $layout: allocations per process after 3 steps: $(echo $short); after 6: $(echo $long)"
    failed=1
  else
    echo "ok $layout: $(echo $short) allocations per process after 3 or 6 steps"
  fi
done
exit $failed
