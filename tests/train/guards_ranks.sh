#!/usr/bin/env bash
# The loss scaler and the spike guard on dp 2 x pp 2: an overflow on one rank of one replica's
# last stage skips the step on every rank (the one all-reduced flag), a spike on one replica's
# loss rolls every rank back alike, and resumes across both continue bitwise.
# usage: guards_ranks.sh MESHTRAIN
set -euo pipefail
meshtrain=$1
source "$(dirname "$0")/genesis_setup.sh"
source "$here/expect.sh"

job=(--data "$scratch/data" --vocab 257 --context 16 --layers 2 --heads 2 --width 16
     --batch 8 --warmup 2 --lr 5e-3 --eval_every 0 --sample_tokens 0 --threads 1
     --nproc 4 --dp 2 --pp 2 --microbatches 2)

# rank 3: data-parallel 1, the last stage
scaled=(--steps 8 --save_every 2 --precision fp16 --loss_scale_window 2)
MT_INJECT_FAULT=inf_grad@3:3 train_into "$scratch/overflow" "${scaled[@]}" || exit 1
[ "$(metric_column "$scratch/overflow" skipped)" = "false false true false false false false false " ] ||
  fail "skipped $(metric_column "$scratch/overflow" skipped)"
[ "$(metric_column "$scratch/overflow" loss_scale)" = "65536 65536 131072 65536 65536 131072 131072 262144 " ] ||
  fail "loss scales $(metric_column "$scratch/overflow" loss_scale)"
resumes_same "$scratch/overflow" 4 "${scaled[@]}"

# rank 1: data-parallel 0, the last stage (it holds that replica's loss)
guarded=(--steps 20 --save_every 4 --spike_guard 4 --spike_rollbacks 2)
MT_INJECT_FAULT=spike@1:14 train_into "$scratch/spike" "${guarded[@]}" || exit 1
grep -q '"spike_skips": 4, "rollbacks": 2, "left_out_batches": \[13, 14, 15, 16\]' \
  "$scratch/spike/summary.json" || fail "summary.json: $(cat "$scratch/spike/summary.json")"
resumes_same "$scratch/spike" 16 "${guarded[@]}"
[ $failed = 0 ] && echo "ok dp 2 x pp 2: one overflow flag, rollbacks alike on every rank, resumed bitwise"
exit $failed
