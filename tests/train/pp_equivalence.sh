#!/usr/bin/env bash
# Pipeline parallelism trains the same model as one process: for each stage count and schedule
# (GPipe, 1F1B, interleaved), dp x pp with ZeRO 0 and 1, tp x pp, an uneven and a
# cost-balanced split, a 20-step run's per-step losses and final parameters (per tensor, by
# norm) equal the single-process run of the same job within 1e-5 relative.
# usage: pp_equivalence.sh MESHTRAIN [quick|zb]   (quick: one layout of each kind, for the
# sanitizer build, where every rank runs several times slower; zb: the zero-bubble schedules zb1
# and zb2 on pp 2 and pp 4, zb1 with two replicas (DDP and ZeRO 1) and with tensor parallelism
# inside)
set -euo pipefail
meshtrain=$1
which=${2:-}
source "$(dirname "$0")/genesis_setup.sh"

# The GPT of tp_equivalence.sh (width 64, 4 heads, lr 1e-3), deep enough for pp 4 x 2 chunks.
job=(--data "$scratch/data" --context 16 --batch 24 --steps 20 --warmup 2 --lr 1e-3
     --vocab 256 --heads 4 --width 64 --eval_every 0 --sample_tokens 0 --threads 1
     --check_every 5 ${MT_TEST_EXTRA:-})
failed=0
# layout NAME LAYERS REFERENCE_MICROBATCHES -- ARGS: the reference is one process over the
# same global batch in micro-batches of the size each rank's are.
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

if [ "$which" = zb ]; then
  layout pp2_zb1 8 4 -- --nproc 2 --pp 2 --microbatches 4 --schedule zb1
  layout pp4_zb1 8 8 -- --nproc 4 --pp 4 --microbatches 8 --schedule zb1
  layout pp2_zb2 8 4 -- --nproc 2 --pp 2 --microbatches 4 --schedule zb2
  layout pp4_zb2 8 8 -- --nproc 4 --pp 4 --microbatches 8 --schedule zb2
  # DDP's one bucket per stage starts with the embeddings' unit: it must wait for the blocks' W
  layout dp2_pp2_zb1 4 8 -- --nproc 4 --pp 2 --microbatches 4 --schedule zb1
  layout dp2_pp2_zb1_zero1 4 8 -- --nproc 4 --pp 2 --microbatches 4 --schedule zb1 --zero 1
  layout tp2_pp2_zb1_selective 8 4 -- --nproc 4 --pp 2 --tp 2 --microbatches 4 --schedule zb1 \
    --recompute selective
  exit $failed
fi
if [ "$which" = quick ]; then
  layout pp4_gpipe 8 4 -- --nproc 4 --pp 4 --microbatches 4 --schedule gpipe
  layout pp3_interleaved_v2 6 6 -- --nproc 3 --pp 3 --microbatches 6 --schedule interleaved --chunks 2
  layout dp2_pp2_interleaved_buckets 8 8 -- --nproc 4 --pp 2 --microbatches 4 \
    --schedule interleaved --chunks 2 --bucket_mb 0.01
  layout tp2_pp2_sp_1f1b 8 4 -- --nproc 4 --pp 2 --tp 2 --sp on --microbatches 4
  layout pp2_uneven_zero1 5 4 -- --nproc 2 --pp 2 --microbatches 4 --zero 1
  # the Release pass runs ZeRO 2 and 3 under pp in zero_pipeline.sh
  layout dp2_pp2_zero3_interleaved 8 8 -- --nproc 4 --pp 2 --microbatches 4 --zero 3 \
    --schedule interleaved --chunks 2
  exit $failed
fi
for schedule in gpipe 1f1b; do
  layout "pp2_$schedule" 8 4 -- --nproc 2 --pp 2 --microbatches 4 --schedule "$schedule"
  layout "pp3_$schedule" 6 6 -- --nproc 3 --pp 3 --microbatches 6 --schedule "$schedule"
  layout "pp4_$schedule" 8 4 -- --nproc 4 --pp 4 --microbatches 4 --schedule "$schedule"
done
layout pp2_interleaved_v2 8 4 -- --nproc 2 --pp 2 --microbatches 4 --schedule interleaved --chunks 2
layout pp2_interleaved_v4 8 4 -- --nproc 2 --pp 2 --microbatches 4 --schedule interleaved --chunks 4
layout pp3_interleaved_v2 6 6 -- --nproc 3 --pp 3 --microbatches 6 --schedule interleaved --chunks 2
layout pp4_interleaved_v2 8 4 -- --nproc 4 --pp 4 --microbatches 4 --schedule interleaved --chunks 2
# Two replicas of two stages: each rank's micro-batch is 3 sequences, as in 8 micro-batches.
layout dp2_pp2_zero1 4 8 -- --nproc 4 --pp 2 --microbatches 4 --zero 1
layout dp2_pp2_zero0_gpipe 4 8 -- --nproc 4 --pp 2 --microbatches 4 --schedule gpipe
# Interleaved stages hold runs of units with the other stage's between them: DDP buckets small
# enough that every unit is one must still cover exactly the stage's own units.
layout dp2_pp2_interleaved_buckets 8 8 -- --nproc 4 --pp 2 --microbatches 4 \
  --schedule interleaved --chunks 2 --bucket_mb 0.01
# Tensor and sequence parallelism inside each stage.
layout tp2_pp2_sp_interleaved 8 4 -- --nproc 4 --pp 2 --tp 2 --sp on --microbatches 4 \
  --schedule interleaved --chunks 2
# 5 layers on 2 stages (3 + 2), and the split balanced by measured cost.
layout pp2_uneven 5 4 -- --nproc 2 --pp 2 --microbatches 4
layout pp2_balance_cost 5 4 -- --nproc 2 --pp 2 --microbatches 4 --balance cost
exit $failed
