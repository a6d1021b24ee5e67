#!/usr/bin/env bash
# --offload trains bit for bit the in-memory model: dp 2 under ZeRO 1 with the optimizer's state
# in files, dp 2 under ZeRO 3 with the parameter shards too (losses, final parameters, and the
# checkpoints with their moments); a run resumed from an offloaded checkpoint ends bitwise the
# uninterrupted one; a full disk (a 1 MiB tmpfs) fails the step on every rank naming the file;
# a read-only offload folder is refused before workers start.
# usage: offload.sh MESHTRAIN [SCRATCH]
set -euo pipefail
meshtrain=$1
scratch=${2:-}
source "$(dirname "$0")/genesis_setup.sh"

job=(--data "$scratch/data" --vocab 256 --context 16 --layers 2 --heads 4 --width 64
     --batch 24 --steps 20 --warmup 2 --lr 3e-3 --eval_every 10 --eval_seqs 10
     --sample_tokens 0 --threads 1 --check_every 5 --save_every 10)
failed=0
fail() { echo "FAIL $*"; failed=1; }
train_into() {
  local out=$1
  shift
  if ! "$meshtrain" train "${job[@]}" --out "$out" "$@" > "$out.log" 2>&1; then
    echo "FAIL $(basename "$out"): the run failed"; cat "$out.log"; failed=1; return 1
  fi
}
check=(/usr/bin/python3 "$here/ckpt_tensors.py")
# RUN's step-10 and step-20 checkpoints (parameters and moments) equal REFERENCE's bitwise.
same_checkpoints() {
  for step in ${3:-10 20}; do
    "${check[@]}" same "$scratch/$1/ckpt/step_$step" "$scratch/$2/ckpt/step_$step" ||
      fail "$2: checkpoint step $step differs from $1's"
  done
}

for layout in "1 optimizer" "3 params"; do
  read -r zero kind <<< "$layout"
  mem=mem$zero off=off_$kind
  train_into "$scratch/$mem" --nproc 2 --zero "$zero" || continue
  if train_into "$scratch/$off" --nproc 2 --zero "$zero" --offload "$kind"; then
    (cd "$scratch" && python3 "$here/compare_runs.py" "$mem" "$off" 0) ||
      fail "--offload $kind changed the training"
    grep -q "offload" "$scratch/$off.log" || fail "$off: no offload column in the memory table"
    same_checkpoints "$mem" "$off"
    [ -z "$(ls -A "$scratch/$off/offload")" ] || fail "$off: offload files left behind"
    # the offloaded checkpoint of step 10, loaded into offload files, goes on to step 20 as the
    # uninterrupted run does
    train_into "$scratch/${off}_resumed" --nproc 2 --zero "$zero" --offload "$kind" \
        --resume "$scratch/$off/ckpt/step_10" && same_checkpoints "$mem" "${off}_resumed" 20
  fi
done

# A full disk: every rank's step fails with the offload file's name and the system's reason.
trap 'umount "$scratch/full" 2> /dev/null; umount "$scratch/ro" 2> /dev/null; rm -rf "$scratch"' EXIT
mkdir -p "$scratch/full" "$scratch/ro"
if [ "$(id -u)" = 0 ] && mount -t tmpfs -o size=256k tmpfs "$scratch/full" &&
   mount -t tmpfs -o ro,size=64k tmpfs "$scratch/ro"; then
  if "$meshtrain" train "${job[@]}" --out "$scratch/full_run" --nproc 2 --zero 0 \
       --offload optimizer --offload_dir "$scratch/full" > "$scratch/full.log" 2>&1; then
    fail "a full offload disk did not stop the run"
  else
    for rank in 0 1; do
      grep -q "^\[$rank\].*offload file '$scratch/full/state.rank[01].bin'.*No space left" \
        "$scratch/full.log" || fail "rank $rank's error does not name the full offload file"
    done
  fi
  if "$meshtrain" train "${job[@]}" --out "$scratch/ro_run" --nproc 2 --offload optimizer \
       --offload_dir "$scratch/ro" > "$scratch/ro.log" 2>&1 ||
     ! grep -q "offload_dir.*not writable" "$scratch/ro.log" || grep -q "^\[[01]\]" "$scratch/ro.log"; then
    fail "a read-only offload folder was not refused before the workers started"; cat "$scratch/ro.log"
  fi
else
  echo "skip: the full-disk case needs root (a tmpfs mount)"
fi
exit $failed
