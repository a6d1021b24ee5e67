#!/usr/bin/env bash
# ctest train_ps_checkpoint: parameter servers write the usual checkpoint (the workers write the
# servers' state, split as DDP's replicas split it): at step 5 it equals DDP's tensor for tensor,
# parameters and moments, bit for bit; it resumes on dp 2 (bitwise) and on pp 2 x tp 2 (within
# 1e-5) to DDP's uninterrupted end; and DDP's checkpoint resumes under the servers (bitwise).
# usage: ps_checkpoint.sh MESHTRAIN
set -euo pipefail
meshtrain=$1
source "$(dirname "$0")/genesis_setup.sh"
check=(/usr/bin/python3 "$here/ckpt_tensors.py")
job=(--data "$scratch/data" --vocab 256 --context 16 --layers 2 --heads 4 --width 64 --batch 8
     --microbatches 2 --steps 10 --warmup 2 --lr 3e-3 --clip 0.5 --eval_every 5 --eval_seqs 8
     --sample_tokens 0 --threads 1 --save_every 5)
failed=0
fail() { echo "FAIL $*"; failed=1; }

# run NAME ARGS...: trains into $scratch/NAME (which may hold a checkpoint to resume).
run() {
  local name=$1
  shift
  timeout 120 "$meshtrain" train "${job[@]}" --out "$scratch/$name" "$@" >"$scratch/$name.log" 2>&1 ||
    { fail "$name: the run failed"; tail -n 20 "$scratch/$name.log"; return 1; }
}

# from_step5 SOURCE NAME: NAME is SOURCE as it was after step 5 (its later checkpoint and final
# files removed), so that --resume auto continues it and its metrics run from 1 to 10.
from_step5() {
  cp -r "$scratch/$1" "$scratch/$2"
  rm -rf "$scratch/$2/ckpt/step_10" "$scratch/$2/model.safetensors" "$scratch/$2/summary.json"
}

# like NAME REFERENCE TOLERANCE: metrics and final parameters
like() {
  (cd "$scratch" && python3 "$here/compare_runs.py" "$2" "$1" "$3") || fail "$1 differs from $2"
}

run ddp --nproc 2 && run ps --nproc 3 --ps_servers 1 || exit 1
"${check[@]}" same "$scratch/ddp/ckpt/step_5" "$scratch/ps/ckpt/step_5" || fail "ps checkpoint differs from DDP's"
"${check[@]}" complete "$scratch/ps/ckpt" || fail "ps checkpoints incomplete"
from_step5 ps ps_to_dp2 && run ps_to_dp2 --nproc 2 --resume auto && like ps_to_dp2 ddp 0
from_step5 ps ps_to_pp2tp2 && run ps_to_pp2tp2 --nproc 4 --pp 2 --tp 2 --resume auto && like ps_to_pp2tp2 ddp 1e-5
from_step5 ddp ddp_to_ps && run ddp_to_ps --nproc 4 --ps_servers 2 --resume auto && like ddp_to_ps ddp 0
exit $failed
