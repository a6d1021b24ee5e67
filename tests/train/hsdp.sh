#!/usr/bin/env bash
# Hybrid sharding (--zero_shard_size) trains the same model as one process: dp 4 in shard
# groups of 2 under ZeRO 1, 2 and 3, and dp 2 x pp 2 in shard groups of 1 under ZeRO 2, each a
# 20-step run's losses, gradient norms and final parameters within 1e-5 relative of the
# one-process run (the replica check comparing the shard groups' copies every 5 steps); a
# checkpoint saved at shard size 2 loads at shard size 4 and on one process bitwise, and one
# saved on one process loads at shard size 2 bitwise.
# usage: hsdp.sh MESHTRAIN   (Release only: 4 ranks on the test machine's cores)
set -euo pipefail
meshtrain=$1
source "$(dirname "$0")/genesis_setup.sh"
source "$here/expect.sh"

job=(--data "$scratch/data" --context 16 --batch 16 --steps 20 --warmup 2 --lr 1e-3
     --vocab 256 --heads 4 --width 64 --layers 2 --eval_every 0 --sample_tokens 0 --threads 1
     --check_every 5)

# Each of the 4 ranks draws 4 sequences of the 16: the reference is one process of one batch.
train_into "$scratch/reference" || exit 1
for zero in 1 2 3; do
  if train_into "$scratch/hsdp_zero$zero" --nproc 4 --zero "$zero" --zero_shard_size 2; then
    (cd "$scratch" && python3 "$here/compare_runs.py" reference "hsdp_zero$zero" 1e-5) ||
      failed=1
  fi
done

# Under a pipeline: dp 2 x pp 2 in shard groups of 1 (ZeRO 2's buffers and reduce-scatters
# over one rank, the slices all-reduced across the replicas, the tied embeddings summed too).
if train_into "$scratch/hsdp_pp" --nproc 4 --pp 2 --microbatches 2 --zero 2 --zero_shard_size 1
then
  (cd "$scratch" && python3 "$here/compare_runs.py" reference hsdp_pp 1e-5) || failed=1
fi

# Checkpoints reshard between shard sizes and onto one process (each loaded and saved again at
# once: a run with no step left saves its state).
check=(/usr/bin/python3 "$here/ckpt_tensors.py")
short=(--steps 4 --save_every 4)
if train_into "$scratch/g2" "${short[@]}" --nproc 4 --zero 3 --zero_shard_size 2 &&
   train_into "$scratch/g4" "${short[@]}" --resume "$scratch/g2/ckpt/step_4" --nproc 4 \
     --zero 3 --zero_shard_size 4 &&
   train_into "$scratch/one" "${short[@]}" --resume "$scratch/g2/ckpt/step_4" &&
   train_into "$scratch/back" "${short[@]}" --resume "$scratch/one/ckpt/step_4" --nproc 4 \
     --zero 2 --zero_shard_size 2; then
  "${check[@]}" same "$scratch/g2/ckpt/step_4" "$scratch/g4/ckpt/step_4" ||
    fail "shard size 2 loaded at shard size 4"
  "${check[@]}" same "$scratch/g2/ckpt/step_4" "$scratch/one/ckpt/step_4" ||
    fail "shard size 2 loaded on one process"
  "${check[@]}" same "$scratch/one/ckpt/step_4" "$scratch/back/ckpt/step_4" ||
    fail "one process loaded at shard size 2"
fi
exit $failed
