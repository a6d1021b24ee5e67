#!/usr/bin/env bash
# Data parallelism trains the same model as one process: for dp 2, 3, 4 x ZeRO 0-3 x gradient
# accumulation 1 and 2, a 20-step run's per-step losses and final parameters (per tensor, by
# norm) equal the single-process run of the same global batch within 1e-5 relative; each step's
# comm_bytes.dp is the gradient once (zero 0, 1) or once per micro-batch (zero 2, 3).
# usage: dp_equivalence.sh MESHTRAIN [SCRATCH]
set -euo pipefail
meshtrain=$1
scratch=${2:-}
source "$(dirname "$0")/genesis_setup.sh"
python=python3

# A small GPT (about 117k parameters): 24 sequences split into 2, 3 or 4 ranks x 1 or 2
# micro-batches. Tensors of a few dozen elements would let one element whose gradient is near
# zero (AdamW divides by its own magnitude) dominate the per-tensor figure; width 64 does not.
job=(--data "$scratch/data" --vocab 256 --context 16 --layers 2 --heads 4 --width 64
     --batch 24 --steps 20 --warmup 2 --lr 3e-3 --eval_every 10 --eval_seqs 10
     --sample_tokens 0 --threads 1 --check_every 5 ${MT_TEST_EXTRA:-})

# The reference is one process over the same global batch in micro-batches of the same size
# as each rank's (dp x microbatches of them): every forward and backward then computes the
# same sequences in the same shapes, and what differs is only how the gradient is summed
# (across ranks, slices and micro-batches) and how the norm is taken over shards.
failed=0
declare -A references
for micro in 1 2; do
  for dp in 2 3 4; do
    steps=$((dp * micro))
    reference="$scratch/ref_m$steps"
    if [ -z "${references[$steps]:-}" ]; then
      "$meshtrain" train "${job[@]}" --microbatches $steps --out "$reference" > /dev/null
      references[$steps]=1
    fi
    for zero in 0 1 2 3; do
      run="$scratch/dp${dp}_zero${zero}_m$micro"
      if ! "$meshtrain" train "${job[@]}" --microbatches $micro --nproc $dp --zero $zero \
             --out "$run" > "$run.log" 2>&1; then
        echo "FAIL dp $dp zero $zero microbatches $micro: the run failed"; cat "$run.log"
        failed=1; continue
      fi
      $python "$here/compare_runs.py" "$reference" "$run" 1e-5 || failed=1
    done
    # the gradient bytes each step hands to the group: zero 0 and 1 reduce once a step, zero 2
    # and 3 reduce-scatter every micro-batch
    /usr/bin/python3 - "$scratch" "$dp" "$micro" <<'EOF' || failed=1
import json, sys
scratch, dp, micro = sys.argv[1], sys.argv[2], int(sys.argv[3])
def per_step(zero):
    lines = open(f"{scratch}/dp{dp}_zero{zero}_m{micro}/metrics.jsonl")
    return {json.loads(l)["comm_bytes"]["dp"] for l in lines if '"comm_bytes"' in l}
got = [per_step(z) for z in range(4)]
once = got[0]
ok = len(once) == 1 and min(once) > 0 and got[1] == once and \
     got[2] == got[3] == {micro * b for b in once}
print(f"{'ok  ' if ok else 'FAIL'} dp {dp} microbatches {micro}: comm_bytes.dp per step by zero "
      f"0-3 {[sorted(g) for g in got]}")
sys.exit(0 if ok else 1)
EOF
  done
done
exit $failed
