#!/usr/bin/env bash
# fp16's loss scaler and the loss-spike guard in runs with injected faults (one process): an
# overflow skips its step and halves the scale, which doubles after the window; a scale below
# its minimum stops the run naming the step and the tensors; spikes skip steps and, after
# spike_rollbacks in a row, roll back to the last checkpoint leaving their batches out; a
# resume across a skipped step and across a rollback continues bitwise. The scale is a power
# of 2, so in fp32 arithmetic a scaled run is the unscaled run bit for bit.
# usage: guards.sh MESHTRAIN
set -euo pipefail
meshtrain=$1
source "$(dirname "$0")/genesis_setup.sh"
source "$here/expect.sh"

job=(--data "$scratch/data" --vocab 257 --context 16 --layers 2 --heads 2 --width 16
     --batch 4 --warmup 2 --lr 5e-3 --eval_every 0 --sample_tokens 0 --threads 1)

# --- the loss scaler ---------------------------------------------------------------------------
scaled=(--steps 8 --save_every 2 --precision fp16 --loss_scale_window 2)
# the scale stays 65536 in one run and doubles every 2 steps in the other: powers of 2 that
# never overflow scale every gradient exactly, so the models are the same bits
train_into "$scratch/plain" --steps 8 --precision fp16 --loss_scale_window 1000000 || exit 1
train_into "$scratch/fp16" "${scaled[@]}" || exit 1
cmp -s "$scratch/plain/model.safetensors" "$scratch/fp16/model.safetensors" ||
  fail "runs whose loss scales differ (powers of 2, no overflow) differ"
MT_INJECT_FAULT=inf_grad@0:3 train_into "$scratch/overflow" "${scaled[@]}" || exit 1
[ "$(metric_column "$scratch/overflow" loss_scale)" = "65536 65536 131072 65536 65536 131072 131072 262144 " ] ||
  fail "loss scales $(metric_column "$scratch/overflow" loss_scale)"
[ "$(metric_column "$scratch/overflow" skipped)" = "false false true false false false false false " ] ||
  fail "skipped $(metric_column "$scratch/overflow" skipped)"
grep -q '"optimizer_steps": 7, "overflow_skips": 1,' "$scratch/overflow/summary.json" ||
  fail "summary.json does not count 7 updates and 1 overflow skip"
# resumed after the skipped step (from step 4): the same steps, scales and model
resumes_same "$scratch/overflow" 4 "${scaled[@]}"
MT_INJECT_FAULT=inf_grad@0:3 must_fail "step 3: the fp16 loss scale fell below loss_scale_min 65536 \(an overflow halved 65536 to 32768\); gradients overflowed in wte.weight, wpe.weight, .* and [0-9]+ more" \
  "$meshtrain" train "${job[@]}" --steps 4 --precision fp16 --loss_scale_min 65536 --out "$scratch/minimum"
echo "ok loss scaler: skip and halve, grow after the window, minimum named, resumed bitwise"

# --- the spike guard -----------------------------------------------------------------------
# batches 14-17 (from 1) spike: steps 14 and 15 skip and roll back to step 12, the next two
# spiking batches do the same, then the run goes on without them
guarded=(--steps 20 --save_every 4 --spike_guard 4 --spike_rollbacks 2)
MT_INJECT_FAULT=spike@0:14 train_into "$scratch/spike" "${guarded[@]}" || exit 1
grep -c '"event": "rollback", "to_step": 12' "$scratch/spike/metrics.jsonl" | grep -qx 2 ||
  fail "no two rollbacks to step 12 in metrics.jsonl"
grep -q '"optimizer_steps": 20, "overflow_skips": 0, "spike_skips": 4, "rollbacks": 2, "left_out_batches": \[13, 14, 15, 16\]' \
  "$scratch/spike/summary.json" || fail "summary.json: $(cat "$scratch/spike/summary.json")"
grep -q "rolled back to step 12" "$scratch/spike.log" || fail "no rollback in the progress"
# resumed before the rollbacks (the fault again) and after them (no fault): the same run
for from in 12 16; do
  fault=spike@0:14
  [ $from = 16 ] && fault=
  MT_INJECT_FAULT=$fault resumes_same "$scratch/spike" $from "${guarded[@]}"
done
MT_INJECT_FAULT=spike@0:14 must_fail "step 15: 2 consecutive loss spikes and no checkpoint to roll back to" \
  "$meshtrain" train "${job[@]}" --steps 16 --spike_guard 4 --spike_rollbacks 2 --out "$scratch/nothing"
[ $failed = 0 ] && echo "ok spike guard: skips, two rollbacks, batches left out, resumed bitwise on both sides"
exit $failed
