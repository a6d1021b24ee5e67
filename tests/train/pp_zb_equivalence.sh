#!/usr/bin/env bash
# The zero-bubble schedule trains the same model as one process: zb1 on pp 2 and pp 4, with two
# data-parallel replicas (DDP and ZeRO 1) and with tensor parallelism inside the stages; a 20-step
# run's per-step losses and final parameters (per tensor, by norm) equal the single-process run
# of the same job within 1e-5 relative, as pp_equivalence.sh checks 1F1B.
# usage: pp_zb_equivalence.sh MESHTRAIN
set -euo pipefail
meshtrain=$1
source "$(dirname "$0")/genesis_setup.sh"

job=(--data "$scratch/data" --context 16 --batch 24 --steps 20 --warmup 2 --lr 1e-3
     --vocab 256 --heads 4 --width 64 --eval_every 0 --sample_tokens 0 --threads 1
     --check_every 5)
failed=0
# layout NAME LAYERS REFERENCE_MICROBATCHES -- ARGS (as in pp_equivalence.sh)
layout() {
  local name=$1 layers=$2 reference_micro=$3
  shift 4
  local reference="ref_l${layers}_m$reference_micro" run="$scratch/$name"
  if [ ! -d "$scratch/$reference" ]; then
    "$meshtrain" train "${job[@]}" --layers "$layers" --microbatches "$reference_micro" \
      --out "$scratch/$reference" > "$scratch/$reference.log" 2>&1 ||
      { cat "$scratch/$reference.log"; exit 1; }
  fi
  if ! timeout 240 "$meshtrain" train "${job[@]}" --layers "$layers" "$@" --out "$run" \
      > "$run.log" 2>&1; then
    echo "FAIL $name: the run failed"; cat "$run.log"; failed=1; return
  fi
  (cd "$scratch" && python3 "$here/compare_runs.py" "$reference" "$name" 1e-5) || failed=1
}

layout pp2_zb1 8 4 -- --nproc 2 --pp 2 --microbatches 4 --schedule zb1
layout pp4_zb1 8 8 -- --nproc 4 --pp 4 --microbatches 8 --schedule zb1
# DDP's one bucket per stage starts with the embeddings' unit: it must wait for the blocks' W
layout dp2_pp2_zb1 4 8 -- --nproc 4 --pp 2 --microbatches 4 --schedule zb1
layout dp2_pp2_zb1_zero1 4 8 -- --nproc 4 --pp 2 --microbatches 4 --schedule zb1 --zero 1
layout tp2_pp2_zb1_selective 8 4 -- --nproc 4 --pp 2 --tp 2 --microbatches 4 --schedule zb1 \
  --recompute selective
exit $failed
