#!/usr/bin/env bash
# Data, pipeline and tensor (with sequence) parallelism composed on one mesh train the same
# model as one process: a 20-step run's per-step losses, gradient norms (before clipping, which
# is active at every step of this job: each element must count once across all three axes) and
# final parameters (per tensor, by norm) within 1e-5 relative of the single-process run, and
# activation recomputation changes nothing: selective and full are bitwise the run without.
# usage: mesh3d_equivalence.sh MESHTRAIN [quick]   (quick: three layouts, one of them with
# every recomputation mode, for the sanitizer build, where every rank runs slower)
set -euo pipefail
meshtrain=$1
quick=${2:-}
source "$(dirname "$0")/genesis_setup.sh"

# A small GPT; validation runs twice and the final sample once, through the stages (11 windows:
# two replicas evaluate 6 and 5, the second in a shorter last batch). The learning rate is 5e-4: AdamW moves
# an element whose gradient is near zero by up to lr per step whatever its size, so rounding
# differences of 1e-7 there become steps of a fraction of lr; at 1e-3 a single such element of
# 37k (of h.3.mlp.proj.weight, clang's build, tp 3) carried its tensor to 1.1e-5 by norm.
job=(--data "$scratch/data" --batch 24 --steps 20 --warmup 2 --lr 5e-4 --vocab 256
     --eval_every 10 --eval_seqs 11 --sample_tokens 24 --threads 1 --check_every 5
     ${MT_TEST_EXTRA:-})
small=(--context 16 --layers 4 --heads 4 --width 64)
failed=0

# run NAME REFERENCE_MICROBATCHES SHAPE... -- ARGS: trains NAME, and (once per shape and
# micro-batch size) the one-process reference over the same global batch in micro-batches of
# the size each rank's are; then compares them.
run() {
  local name=$1 reference_micro=$2
  shift 2
  local shape=()
  while [ "$1" != -- ]; do shape+=("$1"); shift; done
  shift
  local reference="ref_$(echo "${shape[*]}" | tr -d ' -')_m$reference_micro"
  if [ ! -d "$scratch/$reference" ]; then
    "$meshtrain" train "${job[@]}" "${shape[@]}" --microbatches "$reference_micro" \
      --out "$scratch/$reference" > "$scratch/$reference.log" 2>&1 ||
      { cat "$scratch/$reference.log"; exit 1; }
  fi
  if ! timeout 240 "$meshtrain" train "${job[@]}" "${shape[@]}" "$@" --out "$scratch/$name" \
      > "$scratch/$name.log" 2>&1; then
    echo "FAIL $name: the run failed"; tail -n 30 "$scratch/$name.log"; failed=1; return 1
  fi
  (cd "$scratch" && python3 "$here/compare_runs.py" "$reference" "$name" 1e-5) || failed=1
  if ! grep -q -- '--- sample' "$scratch/$name.log" ||
     ! cmp -s <(sample_of "$scratch/$reference.log") <(sample_of "$scratch/$name.log"); then
    echo "FAIL $name: the final sample differs from one process's"; failed=1
  fi
}

# The text between the sample's heading and the closing line, without the launcher's prefix.
sample_of() {
  sed -n '/--- sample/,/done:/p' "$1" | sed 's/^\[0\] //' | grep -av '^done:'
}

# same_as NAME BASE: NAME's losses, gradient norms, validation losses and parameters are
# bitwise BASE's (recomputation remakes exactly the activations the forward made).
same_as() {
  if cmp -s "$scratch/$1/model.safetensors" "$scratch/$2/model.safetensors" &&
     cmp -s <("$untimed" "$scratch/$1/metrics.jsonl") <("$untimed" "$scratch/$2/metrics.jsonl"); then
    echo "ok   $1: bitwise the same training as $2"
  else
    echo "FAIL $1: recomputation changed the training of $2"; failed=1
  fi
}

# layout NAME REFERENCE_MICROBATCHES SHAPE... -- ARGS: the layout without recomputation, then
# with selective and full recomputation (bitwise the same).
layout() {
  local name=$1
  run "$@" || return 0
  shift
  local args=("$@")
  for mode in selective full; do
    run "${name}_$mode" "${args[@]}" --recompute "$mode" || continue
    same_as "${name}_$mode" "$name"
  done
}

if [ "$quick" = quick ]; then
  run dp2_pp2_tp2_sp_1f1b_full 8 "${small[@]}" -- --nproc 8 --dp 2 --pp 2 --tp 2 --sp on \
    --microbatches 4 --recompute full
  layout pp2_tp2_interleaved 4 "${small[@]}" -- --nproc 4 --pp 2 --tp 2 --microbatches 4 \
    --schedule interleaved --chunks 2
  run tp3_pp2_sp 4 --context 24 --layers 4 --heads 6 --width 96 -- --nproc 6 --pp 2 --tp 3 \
    --sp on --microbatches 4
  exit $failed
fi
# 8 ranks: two replicas of two stages of two tensor-parallel ranks, each micro-batch 3
# sequences as in the reference's 8 micro-batches.
layout dp2_pp2_tp2_sp_1f1b 8 "${small[@]}" -- --nproc 8 --dp 2 --pp 2 --tp 2 --sp on \
  --microbatches 4
layout pp2_tp2_interleaved 4 "${small[@]}" -- --nproc 4 --pp 2 --tp 2 --microbatches 4 \
  --schedule interleaved --chunks 2
layout dp2_pp2_tp2_zero1_gpipe 8 "${small[@]}" -- --nproc 8 --dp 2 --pp 2 --tp 2 --zero 1 \
  --microbatches 4 --schedule gpipe
# Degrees that are not powers of two: tp 3 (6 heads, a context of 24 for sequence
# parallelism) on 2 stages, and 3 stages of 2 replicas.
run tp3_pp2_sp 4 --context 24 --layers 4 --heads 6 --width 96 -- --nproc 6 --pp 2 --tp 3 \
  --sp on --microbatches 4 || true
run dp2_pp3_zero1 6 --context 16 --layers 6 --heads 4 --width 64 -- --nproc 6 --dp 2 --pp 3 \
  --zero 1 --microbatches 3 || true
exit $failed
