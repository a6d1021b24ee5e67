#!/usr/bin/env bash
# Distributed checkpoints: a dp4 x zero2 checkpoint reloads on dp2 x zero0, dp3 x zero3 and one
# process (and back) with parameters and Adam moments bitwise the saved ones; a killed run
# resumes bitwise on its layout and within 1e-5 on another dp; SIGKILL of one of 4 workers under
# --max-restarts 1 ends bitwise an uninterrupted run; kills at three points inside a save never
# leave a committed but incomplete checkpoint; async saves write the same bytes; a full disk on a
# small tmpfs fails the save on every rank and keeps the previous checkpoint (and rank 0 keeps an
# asynchronous save's failure when its folder cannot be removed); a leaked
# .partial_removed_step_<N> is swept and --keep holds; bad files are
# clear errors naming file and tensor. (reshard.sh carries checkpoints across tp and pp.)
# usage: checkpoint.sh MESHTRAIN [quick]   (quick: one process and dp 2, for the sanitizers)
set -euo pipefail
meshtrain=$1
quick=${2:-}
scratch=
source "$(dirname "$0")/genesis_setup.sh"
check=(/usr/bin/python3 "$here/ckpt_tensors.py")
source "$here/expect.sh"

job=(--data "$scratch/data" --vocab 256 --context 16 --layers 2 --heads 4 --width 64
     --batch 24 --steps 12 --warmup 2 --lr 3e-3 --eval_every 6 --eval_seqs 10
     --sample_tokens 0 --threads 1 --save_every 3)
train() { "$meshtrain" train "${job[@]}" "$@"; }
# The losses, gradient norms and validation losses of two runs' metrics, bitwise.
same_metrics() {
  diff <(cut -d, -f1-4 "$1/metrics.jsonl"; "$untimed" "$1/metrics.jsonl" | grep -o '"val_loss[^}]*') \
       <(cut -d, -f1-4 "$2/metrics.jsonl"; "$untimed" "$2/metrics.jsonl" | grep -o '"val_loss[^}]*') >/dev/null
}

# --- one process: resume bitwise, and every kind of bad input -----------------------------
ref1="$scratch/ref1"
train --out "$ref1" > /dev/null
ls "$ref1/ckpt" | tr '\n' ' ' | grep -qx "step_12 step_6 step_9 " || fail "keep 3: $(ls "$ref1/ckpt")"
resumed="$scratch/resumed1"
train --out "$resumed" --resume "$ref1/ckpt/step_6" > /dev/null
cmp -s "$ref1/model.safetensors" "$resumed/model.safetensors" || fail "one process: resumed model differs"
same_metrics "$ref1" "$resumed" && fail "resume into a new folder should log steps 7-12 only"
[ "$(head -c 11 "$resumed/metrics.jsonl")" = '{"step": 7,' ] || fail "resumed metrics start at $(head -c 12 "$resumed/metrics.jsonl")"
echo "ok one process: resumed from step 6, model bitwise"

bad="$scratch/bad"
corrupt() { rm -rf "$bad"; cp -r "$ref1/ckpt/step_6" "$bad"; }
corrupt; truncate -s -100 "$bad/rank0.shard"
must_fail "rank0.shard.*bytes where the metadata says" train --out "$scratch/x" --resume "$bad"
corrupt; printf '\xff' | dd of="$bad/rank0.shard" bs=1 seek=5000 conv=notrunc 2>/dev/null
must_fail "rank0.shard': tensor '[a-z0-9.]+' \(param .*checksum" train --out "$scratch/x" --resume "$bad"
corrupt; printf 'XX' | dd of="$bad/rank0.shard" bs=1 seek=0 conv=notrunc 2>/dev/null
must_fail "rank0.shard': not a meshtrain shard \(wrong magic\)" train --out "$scratch/x" --resume "$bad"
corrupt; printf '\x07' | dd of="$bad/rank0.shard" bs=1 seek=8 conv=notrunc 2>/dev/null
must_fail "rank0.shard': format version 7; this build reads version 1" train --out "$scratch/x" --resume "$bad"
corrupt; sed -i 's/"version": 1/"version": 2/' "$bad/metadata.json"
must_fail "metadata.json': version 2; this build reads version 1" train --out "$scratch/x" --resume "$bad"
# a piece moved by one row: two pieces overlap, and the tensor has a gap
corrupt; /usr/bin/python3 - "$bad/metadata.json" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
p = next(p for p in m["pieces"] if p["tensor"] == "h.0.mlp.fc.weight" and p["state"] == "exp_avg")
p["offset"][0] += 1; p["extent"][0] -= 1; p["bytes"] -= 4 * p["extent"][1]
json.dump(m, open(sys.argv[1], "w"))
EOF
must_fail "tensor 'h.0.mlp.fc.weight' \(exp_avg\): the pieces hold .* so they do not tile it" train --out "$scratch/x" --resume "$bad"
corrupt; /usr/bin/python3 - "$bad/metadata.json" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
m["pieces"].append(dict(next(p for p in m["pieces"] if p["tensor"] == "wpe.weight")))
json.dump(m, open(sys.argv[1], "w"))
EOF
must_fail "tensor 'wpe.weight' \(param\): two pieces both hold \[" train --out "$scratch/x" --resume "$bad"
corrupt; sed -i 's/"width": "64"/"width": "32"/' "$bad/metadata.json"
# (the shape keys left to the checkpoint, whose config now describes another model)
must_fail "tensor 'wte.weight' is \[0:256, 0:64\] there and \[0:256, 0:32\] in this model" \
  "$meshtrain" train --data "$scratch/data" --threads 1 --out "$scratch/x" --resume "$bad"
must_fail "config key 'width': 32 contradicts the checkpoint .* trained with 64" train --out "$scratch/x" --resume "$ref1/ckpt/step_6" --width 32
must_fail "config key 'steps': 4 is before the checkpoint's step 6" train --out "$scratch/x" --resume "$ref1/ckpt/step_6" --steps 4
corrupt; rm "$bad/metadata.json"
must_fail "is not a committed checkpoint" train --out "$scratch/x" --resume "$bad"
corrupt; echo '{"format": "meshtrain checkpoint", "version": 1, "step": ' > "$bad/metadata.json"
must_fail "metadata.json': not valid JSON at line" train --out "$scratch/x" --resume "$bad"
corrupt; rm "$bad/rank0.shard"
must_fail "checkpoint shard '.*rank0.shard': cannot open" train --out "$scratch/x" --resume "$bad"
echo "ok bad checkpoints: each a clear error naming the file (and tensor)"
# the checkpoint's settings count before any check: batch 24 (not the default 16) takes 12
# micro-batches, and the schedule's length is the checkpoint's run's unless given
"$meshtrain" train --data "$scratch/data" --threads 1 --sample_tokens 0 --out "$scratch/adopt" \
  --resume "$ref1/ckpt/step_6" --microbatches 12 > "$scratch/adopt.log" 2>&1 || { fail "adopting batch"; cat "$scratch/adopt.log"; }
grep -q '"step": 12,' "$scratch/adopt/metrics.jsonl" || fail "steps not taken from the checkpoint"
# a fresh run never prunes an earlier run's checkpoints
must_fail "'.*ref1/ckpt' holds checkpoints of an earlier run \(the newest step_12\): continue it with --resume auto" \
  train --out "$ref1"
# resumed from an older step in its own folder: the newer (abandoned) steps go at the first save
older="$scratch/older"
cp -r "$ref1" "$older"
train --out "$older" --resume "$older/ckpt/step_6" --steps 7 --save_every 7 > /dev/null
[ "$(ls "$older/ckpt" | tr '\n' ' ')" = "step_6 step_7 " ] || fail "after resuming step 6: $(ls "$older/ckpt")"
# a restarted attempt continues from its own newest commit, not the first attempt's --resume
MT_RESTART_COUNT=1 train --out "$older" --resume "$ref1/ckpt/step_6" --steps 8 > "$older.log" 2>&1 || fail "restart after --resume"
grep -q "resumed from '.*older/ckpt/step_7' at step 7" "$older.log" || fail "a restart did not take its own newest commit"
# auto with nothing saved yet is a fresh start
train --out "$scratch/fresh" --resume auto --steps 3 > /dev/null || fail "resume auto without checkpoints"
# a removal killed after hiding its checkpoint leaks a .partial_removed_step_<N>: the next
# save sweeps it, and pruning a step_<N> of that name still holds --keep
leak="$scratch/leak"
train --out "$leak" --steps 6 > /dev/null
cp -r "$leak/ckpt/step_3" "$leak/ckpt/.partial_removed_step_3"
cp -r "$leak/ckpt/step_3" "$leak/ckpt/.partial_removed_step_1"
train --out "$leak" --resume auto --keep 2 > /dev/null || fail "resume beside a leaked removal"
[ "$(ls -A "$leak/ckpt" | tr '\n' ' ')" = "step_12 step_9 " ] ||
  fail "a leaked .partial_removed_step_<N> with --keep 2 left: $(ls -A "$leak/ckpt" | tr '\n' ' ')"

# --- data parallelism: reshard across dp and ZeRO -------------------------------------------
if [ -n "$quick" ]; then
  src="$scratch/dp2"
  train --out "$src" --nproc 2 --zero 1 > /dev/null
  out="$scratch/to1"
  train --out "$out" --resume "$src/ckpt/step_6" --steps 6 > /dev/null
  "${check[@]}" same "$src/ckpt/step_6" "$out/ckpt/step_6" || failed=1
  killed="$scratch/killed2"
  MT_INJECT_FAULT=kill@1:8 train --out "$killed" --nproc 2 --zero 1 --max-restarts 1 > "$killed.log" 2>&1 || fail "restart"
  cmp -s "$src/model.safetensors" "$killed/model.safetensors" || fail "dp 2: restarted model differs"
  exit $failed
fi

src="$scratch/dp4z2"
train --out "$src" --nproc 4 --zero 2 > /dev/null
for layout in "2 0" "3 3" "1 0"; do
  set -- $layout
  out="$scratch/to_dp$1_zero$2"
  train --out "$out" --resume "$src/ckpt/step_6" --steps 6 --nproc $1 --zero $2 > /dev/null
  "${check[@]}" same "$src/ckpt/step_6" "$out/ckpt/step_6" || failed=1
done
back="$scratch/back_dp4z2"
train --out "$back" --resume "$scratch/to_dp1_zero0/ckpt/step_6" --steps 6 --nproc 4 --zero 2 > /dev/null
"${check[@]}" same "$src/ckpt/step_6" "$back/ckpt/step_6" || failed=1

# resumed on the same layout: bitwise; on another dp degree: within 1e-5 of the uninterrupted run
same="$scratch/resume_same"
MT_INJECT_FAULT=kill@3:8 train --out "$same" --nproc 4 --zero 2 > "$same.log" 2>&1 && fail "kill@3:8 did not stop the job"
train --out "$same" --nproc 4 --zero 2 --resume auto > "$same.log" 2>&1 || { fail "resume auto"; cat "$same.log"; }
grep -q "resumed from '.*step_6' at step 6" "$same.log" || fail "resume auto did not take step 6"
cmp -s "$src/model.safetensors" "$same/model.safetensors" || fail "dp4 resumed model differs"
same_metrics "$src" "$same" || fail "dp4 resumed metrics differ"
echo "ok killed at step 8, resumed from step 6 on dp4 x zero2: metrics and model bitwise"
other="$scratch/resume_dp2"
cp -r "$src" "$other"
train --out "$other" --nproc 2 --zero 3 --resume "$other/ckpt/step_6" > /dev/null
/usr/bin/python3 "$here/compare_runs.py" "$src" "$other" 1e-5 || failed=1

# SIGKILL of one of 4 workers under --max-restarts 1
restart="$scratch/restart"
MT_INJECT_FAULT=kill@2:8 train --out "$restart" --nproc 4 --zero 2 --max-restarts 1 > "$restart.log" 2>&1 \
  || { fail "--max-restarts 1 did not recover"; cat "$restart.log"; }
grep -q "rank 2 .* was killed by signal 9" "$restart.log" || fail "the launcher did not name rank 2's SIGKILL"
grep -q "restarting the job (1 of 1)" "$restart.log" || fail "no restart"
cmp -s "$src/model.safetensors" "$restart/model.safetensors" || fail "restarted model differs"
same_metrics "$src" "$restart" || fail "restarted metrics differ"
echo "ok SIGKILL of rank 2 at step 8 under --max-restarts 1: restarted from step 6, bitwise"

# kills inside a save: the checkpoint of step 6 is never committed incomplete
for fault in kill_in_shard@1:6 kill_after_shard@2:6 kill_before_commit@0:6; do
  run="$scratch/${fault%@*}"
  MT_INJECT_FAULT=$fault train --out "$run" --nproc 4 --zero 2 > "$run.log" 2>&1 && fail "$fault did not stop the job"
  [ -e "$run/ckpt/step_6" ] && fail "$fault: step_6 committed"
  "${check[@]}" complete "$run/ckpt" > /dev/null || fail "$fault: an incomplete committed checkpoint"
  train --out "$run" --nproc 4 --zero 2 --resume auto > "$run.log" 2>&1 || { fail "$fault: resume"; cat "$run.log"; }
  grep -q "resumed from '.*step_3' at step 3" "$run.log" || fail "$fault: did not resume from step 3"
  cmp -s "$src/model.safetensors" "$run/model.safetensors" || fail "$fault: model differs after the resume"
  [ -z "$(ls -A "$run/ckpt" | grep partial)" ] || fail "$fault: a partial folder outlived the next save"
done
echo "ok kills inside the save of step 6 (mid-shard, after the shard, before the commit): step 3 kept, resumed bitwise"

# asynchronous saves write the same checkpoints
async="$scratch/async"
train --out "$async" --nproc 4 --zero 2 --async_save on > /dev/null
for step in 6 9 12; do
  for r in 0 1 2 3; do
    cmp -s "$src/ckpt/step_$step/rank$r.shard" "$async/ckpt/step_$step/rank$r.shard" || fail "async shard $r of step $step differs"
  done
done
cmp -s "$src/model.safetensors" "$async/model.safetensors" || fail "async: model differs"
echo "ok async_save: the same shards, the same model"

# a full disk: a tmpfs with room for one checkpoint and less than the next
disk="$scratch/disk"
mkdir -p "$disk"
if mount -t tmpfs -o size=4m tmpfs "$disk" 2>/dev/null; then
  # a worker may still be leaving when the job ends: a lazy unmount then
  release() { umount "$disk" 2>/dev/null || umount -l "$disk" 2>/dev/null || true; }
  trap 'release; { umount -l "$scratch/busy/ckpt/.partial_step_3" 2>/dev/null || true; }; rm -rf "$scratch"' EXIT
  bytes=$(du -sb "$src/ckpt/step_6" | cut -f1)
  release
  # the first checkpoint, plus three of the four shards of the second
  mount -t tmpfs -o size=$((bytes + 3 * bytes / 4 / 4 * 4 + 65536)) tmpfs "$disk"
  full="$disk/run"
  if train --out "$full" --nproc 4 --zero 2 --save_every 6 --steps 12 > "$scratch/full.log" 2>&1; then
    fail "a full disk did not fail the save"
  else
    for r in 0 1 2 3; do
      grep -q "^\[$r\] meshtrain train: error: checkpoint step 12: writing the shards failed on rank [0-9]: .*No space left on device" "$scratch/full.log" \
        || fail "rank $r did not report the full disk"
    done
    [ -e "$full/ckpt/step_12" ] && fail "full disk: step_12 committed"
    ls "$full/ckpt" | grep -q partial && fail "full disk: the partial folder stayed"
    "${check[@]}" complete "$full/ckpt" > /dev/null || fail "full disk: step 6 damaged"
    echo "ok a full disk fails the save on every rank: $(grep -m1 -o 'writing the shards failed on rank [0-9]: .*' "$scratch/full.log" | cut -c1-150)"
  fi
  release
  # an asynchronous save that fails where its folder cannot be removed (a full tmpfs mounted
  # on it): rank 0 reports the save's failure, not only the removal's
  busy="$scratch/busy"
  mkdir -p "$busy/ckpt/.partial_step_3"
  mount -t tmpfs -o size=64k tmpfs "$busy/ckpt/.partial_step_3"
  train --out "$busy" --nproc 2 --async_save on --steps 6 > "$scratch/busy.log" 2>&1 &&
    fail "a save into a full folder succeeded"
  umount "$busy/ckpt/.partial_step_3" 2>/dev/null || umount -l "$busy/ckpt/.partial_step_3" || true
  grep -q "^\[0\] meshtrain train: error: checkpoint step 3: writing the shards failed on rank [0-9]: .*No space left on device (and its folder stays: cannot remove" "$scratch/busy.log" ||
    fail "rank 0 lost the failed asynchronous save's message: $(grep '^\[0\].*error' "$scratch/busy.log")"
  grep -q "^\[0\] meshtrain train: error: checkpoint step 3: writing the shards failed" "$scratch/busy.log" &&
    echo "ok a failed asynchronous save whose folder cannot be removed: rank 0 reports the cause"
else
  echo "skipped the full-disk case: cannot mount a tmpfs here (needs root)"
fi
exit $failed
