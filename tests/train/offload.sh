#!/usr/bin/env bash
# --offload trains bit for bit the in-memory model over 50 steps: dp 2 under ZeRO 1 with the
# optimizer's state in files, dp 2 under ZeRO 3 with the parameter shards too, and dp 2 x pp 2
# under ZeRO 1 (losses, final parameters, and the checkpoints with their moments); a run resumed
# from an offloaded checkpoint ends bitwise the uninterrupted one. --offload_delay on: the
# offloaded update on its thread equals the in-memory reference of the same one-step delay
# (bitwise, and resumed), whose losses follow the normal run's up to the first step that sees
# a held-back update and no further. A SIGKILL amid a write-back, then --resume auto, ends
# bitwise the uninterrupted run. Records move by io_uring (auto) or pread/pwrite, to the same
# bits. A full disk (a 256 KiB tmpfs) fails the step on every rank
# naming the file; a read-only offload folder is refused before workers start.
# usage: offload.sh MESHTRAIN [SCRATCH]
set -euo pipefail
meshtrain=$1
scratch=${2:-}
source "$(dirname "$0")/genesis_setup.sh"

job=(--data "$scratch/data" --vocab 256 --context 16 --layers 2 --heads 4 --width 64
     --batch 24 --steps 50 --warmup 2 --lr 3e-3 --eval_every 25 --eval_seqs 10
     --sample_tokens 0 --threads 1 --check_every 5 --save_every 25)
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
# RUN's step-25 and step-50 checkpoints (parameters and moments) equal REFERENCE's bitwise.
same_checkpoints() {
  for step in ${3:-25 50}; do
    "${check[@]}" same "$scratch/$1/ckpt/step_$step" "$scratch/$2/ckpt/step_$step" ||
      fail "$2: checkpoint step $step differs from $1's"
  done
}

# dp 2 under ZeRO 1 and 3, and dp 2 x pp 2 under ZeRO 1 (the 3D mesh's pipeline with ZeRO)
for layout in "1 optimizer" "3 params" "1 optimizer --pp 2 --microbatches 2"; do
  read -r zero kind more <<< "$layout"
  read -ra more <<< "${more:-}"
  nproc=$((2 * (${#more[@]} ? 2 : 1)))
  mem=mem$zero$((nproc / 2)) off=off_$kind$((nproc / 2))
  train_into "$scratch/$mem" --nproc $nproc --zero "$zero" "${more[@]}" || continue
  if train_into "$scratch/$off" --nproc $nproc --zero "$zero" --offload "$kind" "${more[@]}"; then
    (cd "$scratch" && python3 "$here/compare_runs.py" "$mem" "$off" 0) ||
      fail "--offload $kind changed the training"
    grep -q "offload" "$scratch/$off.log" || fail "$off: no offload column in the memory table"
    same_checkpoints "$mem" "$off"
    [ -z "$(ls -A "$scratch/$off/offload")" ] || fail "$off: offload files left behind"
    # the offloaded checkpoint of step 25, loaded into offload files, goes on to step 50 as the
    # uninterrupted run does
    [ $nproc = 2 ] && train_into "$scratch/${off}_resumed" --nproc 2 --zero "$zero" \
        --offload "$kind" --resume "$scratch/$off/ckpt/step_25" &&
      same_checkpoints "$mem" "${off}_resumed" 50
  fi
done

# the engine named in the log; pread/pwrite asked for by name trains the same bits as auto's
# (io_uring where the build and kernel have it)
grep -Eq "offload: .* by (io_uring|pread/pwrite)" "$scratch/off_optimizer1.log" ||
  fail "off_optimizer1: the log does not name the offload I/O engine"
if train_into "$scratch/off_pread" --nproc 2 --zero 1 --offload optimizer --offload_io pread; then
  grep -q "offload: .* by pread/pwrite" "$scratch/off_pread.log" ||
    fail "--offload_io pread: the log does not name pread/pwrite"
  (cd "$scratch" && python3 "$here/compare_runs.py" mem11 off_pread 0) ||
    fail "--offload_io pread changed the training"
  same_checkpoints off_optimizer1 off_pread
fi

# --offload_delay on after 3 normal updates: the threaded, offloaded update against the
# in-memory reference of the same delay (bitwise, and resumed from its step-25 checkpoint)
delay=(--nproc 2 --zero 1 --offload_delay on --offload_delay_warmup 3)
if train_into "$scratch/delay_mem" "${delay[@]}" &&
   train_into "$scratch/delay_off" "${delay[@]}" --offload optimizer; then
  (cd "$scratch" && python3 "$here/compare_runs.py" delay_mem delay_off 0) ||
    fail "--offload_delay: the offloaded update differs from the in-memory one"
  same_checkpoints delay_mem delay_off
  train_into "$scratch/delay_resumed" "${delay[@]}" --offload optimizer \
      --resume "$scratch/delay_off/ckpt/step_25" && same_checkpoints delay_mem delay_resumed 50
  # steps 1-4 run on the same parameters as the normal run's (updates 1-3 applied before each
  # next step); step 5 on those of step 4 still (update 4 held back), and so on
  /usr/bin/python3 - "$scratch/mem11/metrics.jsonl" "$scratch/delay_mem/metrics.jsonl" <<'PY' ||
import json, sys
normal, delayed = ([json.loads(l)["loss"] for l in open(p)] for p in sys.argv[1:])
assert normal[:4] == delayed[:4], f"steps 1-4 differ: {normal[:4]} {delayed[:4]}"
assert all(a != b for a, b in zip(normal[4:8], delayed[4:8])), "steps 5-8 took no delay"
PY
    fail "--offload_delay: the losses do not show a one-step delay after 3 normal updates"
fi
# SIGKILL of rank 1 amid the write-back of step 30's update, then --resume auto: from step 25
# to the uninterrupted run's step 50 bitwise
killed="$scratch/killed"
if MT_INJECT_FAULT=kill_in_writeback@1:30 "$meshtrain" train "${job[@]}" --out "$killed" \
     --nproc 2 --zero 1 --offload optimizer > "$killed.log" 2>&1; then
  fail "kill_in_writeback@1:30 did not stop the job"
elif ! grep -q "rank 1 .*killed by signal 9" "$killed.log"; then
  fail "kill_in_writeback: the launcher did not name rank 1's SIGKILL"; cat "$killed.log"
elif train_into "$killed" --nproc 2 --zero 1 --offload optimizer --resume auto; then
  grep -q "resumed from '.*step_25' at step 25" "$killed.log" ||
    fail "kill_in_writeback: --resume auto did not take step 25"
  same_checkpoints mem11 killed 50
  cmp -s "$scratch/mem11/model.safetensors" "$killed/model.safetensors" ||
    fail "kill_in_writeback: the resumed model differs from the uninterrupted one"
fi

# the delayed update with offloaded parameters: refused before the workers start
if "$meshtrain" train "${job[@]}" --out "$scratch/delay_params" --nproc 2 --zero 3 \
     --offload params --offload_delay on > "$scratch/delay_params.log" 2>&1 ||
   ! grep -q "offload_delay.*use --offload optimizer" "$scratch/delay_params.log" ||
   grep -q "^\[[01]\]" "$scratch/delay_params.log"; then
  fail "--offload_delay with --offload params was not refused up front"; cat "$scratch/delay_params.log"
fi

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
