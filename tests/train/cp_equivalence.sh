#!/usr/bin/env bash
# Context parallelism trains the same model as one process: cp 2 and cp 4 (zig-zag chunks, ring
# attention) at context 256 and 1,024, dp 2 x cp 2 with ZeRO 1, cp 2 x pp 2 (1F1B) and cp 2 x
# tp 2 with sp, each within 1e-5 relative of the single-process run (per-step losses, gradient
# norms, validation, every tensor), and cp 2 in bf16 within bf16's 5e-3; a cp 2
# checkpoint loads on one process bitwise, and back; bad layouts are refused before any worker.
# usage: cp_equivalence.sh MESHTRAIN
set -euo pipefail
meshtrain=$1
source "$(dirname "$0")/genesis_setup.sh"
source "$here/expect.sh"
check=(/usr/bin/python3 "$here/ckpt_tensors.py")

# Context 256 in four 64-row chunks at cp 2, eight 32-row chunks at cp 4: chunks smaller and
# larger than the kernel's 64-row blocks.
job=(--data "$scratch/data" --vocab 256 --context 256 --layers 2 --heads 4 --width 64
     --batch 8 --steps 8 --warmup 2 --lr 1e-3 --eval_every 4 --eval_seqs 8 --sample_tokens 0
     --threads 1 --check_every 4 ${MT_TEST_EXTRA:-})

# layout NAME REFERENCE_MICROBATCHES ARGS...: the reference is one process over the same
# global batch in micro-batches of the size each data replica's are.
layout() {
  local name=$1 reference_micro=$2
  shift 2
  local reference="$scratch/ref_m$reference_micro"
  [ -d "$reference" ] || train_into "$reference" --microbatches "$reference_micro" || exit 1
  train_into "$scratch/$name" "$@" || return 0
  (cd "$scratch" && /usr/bin/python3 "$here/compare_runs.py" "${reference##*/}" "$name" 1e-5) ||
    fail "$name"
}

layout cp2 1 --nproc 2 --cp 2 --save_every 4
layout cp4 1 --nproc 4 --cp 4
layout dp2_cp2_zero1 2 --nproc 4 --dp 2 --cp 2 --zero 1
layout cp2_pp2 2 --nproc 4 --cp 2 --pp 2 --microbatches 2
layout cp2_tp2_sp 1 --nproc 4 --cp 2 --tp 2 --sp on

# Context 1,024 on a smaller model (a few seconds): cp 2 in four 256-row chunks and cp 4 in
# eight 128-row chunks, several of the kernel's blocks per chunk, against one process.
long=(--context 1024 --layers 1 --width 32 --heads 2 --batch 2 --steps 4 --eval_every 2
      --eval_seqs 2)
if train_into "$scratch/ref_1024" "${long[@]}"; then
  for cp in 2 4; do
    train_into "$scratch/cp${cp}_1024" "${long[@]}" --nproc "$cp" --cp "$cp" &&
      { (cd "$scratch" && /usr/bin/python3 "$here/compare_runs.py" ref_1024 "cp${cp}_1024" 1e-5) ||
          fail "cp${cp}_1024"; }
  done
fi

# bf16: cp 2 against one bf16 process, at half_equivalence.sh's 5e-3 (its header says why: a
# different summation order flips an element's bf16 rounding now and then, which AdamW carries
# into the small bias tensors).
if train_into "$scratch/ref_bf16" --precision bf16; then
  train_into "$scratch/cp2_bf16" --precision bf16 --nproc 2 --cp 2 &&
    { (cd "$scratch" && /usr/bin/python3 "$here/compare_runs.py" ref_bf16 cp2_bf16 5e-3) ||
        fail "cp2_bf16"; }
fi
must_fail "keys 'cp' and 'precision'.*fp32 or bf16, not fp16" \
  "$meshtrain" train "${job[@]}" --precision fp16 --nproc 2 --cp 2 --out "$scratch/bad"

# The cp 2 checkpoint on one process and back: parameters and moments bitwise the saved ones.
saved="$scratch/cp2/ckpt/step_4"
# (a run with no step left to take saves the state it loaded)
train_into "$scratch/at_one" --steps 4 --save_every 4 --resume "$saved" &&
  { "${check[@]}" same "$saved" "$scratch/at_one/ckpt/step_4" || fail "cp 2 loaded on one"; }
train_into "$scratch/back" --steps 4 --save_every 4 --resume "$scratch/at_one/ckpt/step_4" \
  --nproc 2 --cp 2 &&
  { "${check[@]}" same "$saved" "$scratch/back/ckpt/step_4" || fail "back on cp 2"; }

# Refused before any worker starts, naming the keys.
must_fail "keys 'cp' and 'context'.*context 250 does not divide" \
  "$meshtrain" train "${job[@]}" --context 250 --nproc 2 --cp 2 --out "$scratch/bad"
must_fail "keys 'cp' and 'schedule'" \
  "$meshtrain" train "${job[@]}" --nproc 4 --cp 2 --pp 2 --microbatches 2 --schedule zb1 \
  --out "$scratch/bad"
must_fail "keys 'cp' and 'attention'" \
  "$meshtrain" train "${job[@]}" --nproc 2 --cp 2 --attention plain --out "$scratch/bad"
[ ! -e "$scratch/bad" ] || fail "a refused layout left $scratch/bad"
exit $failed
