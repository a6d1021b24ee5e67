#!/usr/bin/env bash
# ctest train_ps_sync: synchronous parameter servers train DDP's model bit for bit. A 20-step
# job on 2 workers with 1 and with 2 servers, and on 2 workers of tp 2 with 2 servers, against
# DDP (dp 2, and dp 2 x tp 2) on the same ranks' data: every step's loss and gradient norm and
# every final parameter equal, exactly.
# usage: ps_sync.sh MESHTRAIN
set -euo pipefail
meshtrain=$1
source "$(dirname "$0")/genesis_setup.sh"
job=(--data "$scratch/data" --vocab 256 --context 16 --layers 2 --heads 4 --width 64 --batch 8
     --microbatches 2 --steps 20 --warmup 2 --lr 3e-3 --clip 0.5 --eval_every 10 --eval_seqs 8
     --sample_tokens 0 --threads 1 --check_every 5)
failed=0

# run NAME ARGS...: trains into $scratch/NAME.
run() {
  local name=$1
  shift
  if ! timeout 120 "$meshtrain" train "${job[@]}" --out "$scratch/$name" "$@" \
       >"$scratch/$name.log" 2>&1; then
    echo "FAIL $name: the run failed"
    tail -n 20 "$scratch/$name.log"
    failed=1
    return 1
  fi
}

# same NAME REFERENCE: bit for bit.
same() {
  (cd "$scratch" && python3 "$here/compare_runs.py" "$2" "$1" 0) || { echo "FAIL $1 differs from $2"; failed=1; }
}

run ddp2 --nproc 2 && run ps_1server --nproc 3 --ps_servers 1 && same ps_1server ddp2
run ps_2servers --nproc 4 --ps_servers 2 && same ps_2servers ddp2
run ddp2_tp2 --nproc 4 --tp 2 && run ps_tp2 --nproc 6 --tp 2 --ps_servers 2 && same ps_tp2 ddp2_tp2
exit $failed
