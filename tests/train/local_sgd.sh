#!/usr/bin/env bash
# Local SGD and DiLoCo on dp 2: with --optimizer sgd and --clip 0, local SGD with one local step
# and DiLoCo with one local step, outer sgd, outer lr 1 and momentum 0 train the model DDP does
# (losses, validation losses and parameters within 1e-6 relative over 20 steps); more local steps
# train another one (no gradient all-reduce between synchronisations); runs killed mid-round
# resume bitwise (local SGD under AdamW, DiLoCo nesterov under SGD with momentum); bad settings
# are refused before any worker starts, naming the keys. usage: local_sgd.sh MESHTRAIN
set -euo pipefail
meshtrain=$1
scratch=
source "$(dirname "$0")/genesis_setup.sh"
source "$here/expect.sh"

job=(--data "$scratch/data" --vocab 256 --context 16 --layers 2 --heads 4 --width 64
     --batch 24 --steps 20 --warmup 2 --eval_every 10 --eval_seqs 10
     --sample_tokens 0 --threads 1 --check_every 1 --nproc 2)
sgd=(--optimizer sgd --clip 0 --lr 0.1 --min_lr 0.01)

# --- one local step: DDP's model ----------------------------------------------------------
train_into "$scratch/ddp" "${sgd[@]}"
train_into "$scratch/local1" "${sgd[@]}" --local_steps 1 --outer_optimizer avg
train_into "$scratch/diloco1" "${sgd[@]}" --local_steps 1 --outer_optimizer sgd --outer_lr 1 \
  --outer_momentum 0
# each replica's gradient norm is its own under local steps: losses and parameters compared
for run in local1 diloco1; do
  /usr/bin/python3 "$here/compare_runs.py" "$scratch/ddp" "$scratch/$run" 1e-6 loss,val_loss ||
    fail "$run differs from DDP"
done

# --- more local steps: another model, replicas equal after every round ----------------------
train_into "$scratch/local4" "${sgd[@]}" --local_steps 4
if /usr/bin/python3 "$here/compare_runs.py" "$scratch/ddp" "$scratch/local4" 1e-6 loss > /dev/null; then
  fail "4 local steps trained DDP's model: the gradients were still all-reduced"
fi
grep -q '"val_loss"' "$scratch/local4/metrics.jsonl" || fail "local4 reported no validation loss"
echo "ok local steps 4: another model than DDP's, replicas checked after each round"

# --- resume mid-round bitwise ---------------------------------------------------------------
# The losses, validation losses and final parameters of two runs, bitwise.
same_run() {
  cmp -s "$1/model.safetensors" "$2/model.safetensors" || return 1
  diff <(grep -o '"loss": [^,]*' "$1/metrics.jsonl"; grep -o '"val_loss[^,}]*' "$1/metrics.jsonl") \
       <(grep -o '"loss": [^,]*' "$2/metrics.jsonl"; grep -o '"val_loss[^,}]*' "$2/metrics.jsonl") > /dev/null
}
resume_case() {
  local name=$1; shift
  train_into "$scratch/$name" --save_every 7 --keep 5 "$@" || return 0
  train_into "$scratch/$name.resumed" --resume "$scratch/$name/ckpt/step_7" "$@" || return 0
  [ -f "$scratch/$name/ckpt/step_7/local_rank1.bin" ] || fail "$name: no local state for rank 1"
  # the resumed run's metrics start at step 8: compare those steps
  grep -v '"step": [1-7],' "$scratch/$name/metrics.jsonl" > "$scratch/$name.tail" || true
  mkdir -p "$scratch/$name.cut"
  cp "$scratch/$name.tail" "$scratch/$name.cut/metrics.jsonl"
  cp "$scratch/$name/model.safetensors" "$scratch/$name.cut/"
  if same_run "$scratch/$name.cut" "$scratch/$name.resumed"; then
    echo "ok $name: resumed at step 7 (mid-round) bitwise"
  else
    fail "$name: the run resumed at step 7 differs from the uninterrupted one"
  fi
}
resume_case local_adamw --local_steps 3 --lr 3e-3
resume_case diloco_sgd "${sgd[@]}" --local_steps 3 --outer_optimizer nesterov --outer_lr 0.7 \
  --outer_momentum 0.9 --momentum 0.9
# the shared shards of a mid-round checkpoint hold the synchronised model: step 7's (after the
# sync at step 6) exports as step 6's of the same run saved at a sync
train_into "$scratch/local_at6" --save_every 6 --keep 5 --local_steps 3 --lr 3e-3
"$meshtrain" export --ckpt "$scratch/local_adamw/ckpt/step_7" --out "$scratch/at7.safetensors" > /dev/null &&
  "$meshtrain" export --ckpt "$scratch/local_at6/ckpt/step_6" --out "$scratch/at6.safetensors" > /dev/null ||
  fail "export of the local-steps checkpoints"
# the same tensors, bitwise (the metadata names each file's step)
same_tensors() {
  /usr/bin/python3 -c 'import json, struct, sys
def tensors(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    return header, data[8 + n:]
sys.exit(tensors(sys.argv[1]) != tensors(sys.argv[2]))' "$1" "$2"
}
same_tensors "$scratch/at6.safetensors" "$scratch/at7.safetensors" ||
  fail "a mid-round checkpoint's shared shards are not the synchronised model"
must_fail "local_rank.*saved by rank 0 of dp 2 .*this run is rank 0 of dp 1" \
  "$meshtrain" train "${job[@]}" --nproc 1 --local_steps 3 --lr 3e-3 --out "$scratch/x" \
  --resume "$scratch/local_adamw/ckpt/step_7"

# --- refused before any worker starts -------------------------------------------------------
refused() {
  must_fail "$1" "$meshtrain" train "${job[@]}" --out "$scratch/bad" "${@:2}"
  ! grep -q "^model:" "$scratch/fail.log" || fail "a worker started for: ${*:2}"
}
refused "config keys 'local_steps' and 'zero'" --local_steps 4 --zero 1
refused "config keys 'outer_optimizer' and 'zero'" --outer_optimizer avg --zero 3
refused "config key 'local_steps'.* 0 is outside" --local_steps 0
refused "config key 'outer_lr'.* -1 is outside" --outer_lr -1
refused "config key 'outer_optimizer': 'adam' is none of" --local_steps 2 --outer_optimizer adam
echo "ok bad settings refused before the workers"
[ $failed = 0 ] && echo "local SGD and DiLoCo: ok"
exit $failed
