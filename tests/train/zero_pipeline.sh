#!/usr/bin/env bash
# ZeRO 2 and 3 under pipeline parallelism train the same model as one process: dp 2 x pp 2 on
# GPipe, 1F1B and interleaved (zb1 is refused: test_run_plan), and dp 2 x pp 2 x tp 2 with
# sequence parallelism and ZeRO 2 and 3, each a 20-step run's losses, gradient norms and final
# parameters within 1e-5 relative of the one-process run; --zero3_keep_params on is bitwise the
# run without (the same gathered values, fewer gathers); a checkpoint saved under pp with ZeRO 3
# loads on dp 4 and back bitwise.
# usage: zero_pipeline.sh MESHTRAIN   (Release only: up to 8 ranks on the test machine's cores)
set -euo pipefail
meshtrain=$1
source "$(dirname "$0")/genesis_setup.sh"
source "$here/expect.sh"

# The GPT of pp_equivalence.sh, four layers (one per virtual stage of pp 2 x 2 chunks).
job=(--data "$scratch/data" --context 16 --batch 24 --steps 20 --warmup 2 --lr 1e-3
     --vocab 256 --heads 4 --width 64 --layers 4 --eval_every 0 --sample_tokens 0 --threads 1
     --check_every 5)

# Each rank's micro-batch is 3 sequences (24 over dp 2 x 4 micro-batches): the reference is one
# process in 8 micro-batches.
train_into "$scratch/reference" --microbatches 8 || exit 1
layout() {
  local name=$1; shift
  train_into "$scratch/$name" --nproc 4 --pp 2 --microbatches 4 "$@" || return 1
  (cd "$scratch" && python3 "$here/compare_runs.py" reference "$name" 1e-5) || failed=1
}
for zero in 2 3; do
  layout "zero${zero}_gpipe" --zero "$zero" --schedule gpipe || true
  layout "zero${zero}_1f1b" --zero "$zero" --schedule 1f1b || true
  layout "zero${zero}_interleaved" --zero "$zero" --schedule interleaved --chunks 2 || true
done

# Kept parameters: the same values gathered once per step instead of every pass.
if layout zero3_interleaved_keep --zero 3 --schedule interleaved --chunks 2 \
     --zero3_keep_params on; then
  (cd "$scratch" && python3 "$here/compare_runs.py" zero3_interleaved zero3_interleaved_keep 0) ||
    fail "--zero3_keep_params on changed the training"
fi

# 8 ranks: two replicas of two stages of two tensor-parallel ranks with sequence parallelism,
# under ZeRO 2 and 3.
for zero in 2 3; do
  train_into "$scratch/dp2_pp2_tp2_sp_zero$zero" --nproc 8 --dp 2 --pp 2 --tp 2 --sp on \
      --zero "$zero" --microbatches 4 &&
    { (cd "$scratch" && python3 "$here/compare_runs.py" reference "dp2_pp2_tp2_sp_zero$zero" \
        1e-5) || failed=1; }
done

# A checkpoint of dp 2 x pp 2 under ZeRO 3 loads on dp 4 and back onto the pipeline, bitwise
# (each loaded and saved again at once: a run with no step left saves its state).
check=(/usr/bin/python3 "$here/ckpt_tensors.py")
pipeline=(--nproc 4 --pp 2 --microbatches 4 --zero 3 --schedule 1f1b)
if train_into "$scratch/saved" --steps 6 --save_every 6 "${pipeline[@]}" &&
   train_into "$scratch/dp4" --steps 6 --save_every 6 --resume "$scratch/saved/ckpt/step_6" \
     --nproc 4 --zero 3 &&
   train_into "$scratch/back" --steps 6 --save_every 6 --resume "$scratch/dp4/ckpt/step_6" \
     "${pipeline[@]}"; then
  "${check[@]}" same "$scratch/saved/ckpt/step_6" "$scratch/dp4/ckpt/step_6" ||
    fail "loaded on dp 4"
  "${check[@]}" same "$scratch/saved/ckpt/step_6" "$scratch/back/ckpt/step_6" ||
    fail "back on dp 2 x pp 2"
fi
exit $failed
