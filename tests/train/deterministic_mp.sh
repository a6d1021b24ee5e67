#!/usr/bin/env bash
# --deterministic on under tensor and pipeline parallelism and half precision: with the same tp
# (with and without sp), pp, schedule, precision and ZeRO stage, dp 1 and 2 and several
# micro-batch counts must log the same losses and gradient norms and write byte-identical
# model.safetensors. Without it tp 2 on dp 2
# differs from tp 2 on dp 1 (so the comparison can tell). bench/deterministic/run.sh runs the
# larger matrix over 20 steps.
# usage: deterministic_mp.sh MESHTRAIN [SCRATCH]
set -euo pipefail
meshtrain=$1
scratch=${2:-}
source "$(dirname "$0")/genesis_setup.sh"
export OMP_WAIT_POLICY=passive

job=(--data "$scratch/data" --vocab 256 --context 16 --layers 2 --heads 4 --width 64
     --batch 16 --steps ${MT_DETERMINISTIC_STEPS:-6} --warmup 2 --lr 3e-3 --eval_every 0
     --sample_tokens 0 --check_every 2 --threads 1)

# the per-step losses and gradient norms as logged, then the model's bytes
fingerprint() {
  grep -o '"loss": [^,]*, "lr": [^,]*, "grad_norm": [^,]*' "$1/metrics.jsonl" | md5sum | cut -c1-12
  md5sum < "$1/model.safetensors" | cut -c1-12
}

failed=0
run() { # name, ranks, then train flags
  local name=$1 ranks=$2; shift 2
  if ! "$meshtrain" train "${job[@]}" --nproc "$ranks" "$@" --out "$scratch/$name" \
       > "$scratch/$name.log" 2>&1; then
    echo "FAIL $name: the run failed"; cat "$scratch/$name.log"; failed=1; return 1
  fi
}

# a set: its name, the ranks per replica (tp x pp), its flags, then dp:microbatches layouts
# that must agree bit for bit
sets=${MT_DETERMINISTIC_SETS:-"tp2_zero0|2|--tp 2 --zero 0|1:1 2:4
tp2_sp_zero3|2|--tp 2 --sp on --zero 3|1:4 2:1
pp2_1f1b_zero0|2|--pp 2 --schedule 1f1b --zero 0|1:2 2:4
pp2_interleaved_zero3|2|--pp 2 --schedule interleaved --chunks 2 --layers 4 --zero 3|1:4 2:2
bf16_zero3_threads2|1|--precision bf16 --zero 3 --threads 2|1:1 2:4
fp16_pp2|2|--precision fp16 --pp 2|1:2 2:4"}
while IFS='|' read -r set ranks flags layouts; do
  reference=""
  for layout in $layouts; do
    IFS=: read -r dp micro <<< "$layout"
    name="${set}_dp${dp}_m${micro}"
    # shellcheck disable=SC2086 # flags are words
    run "$name" $((dp * ranks)) --dp "$dp" --microbatches "$micro" $flags --deterministic on ||
      continue
    print=$(fingerprint "$scratch/$name" | tr '\n' ' ')
    if [ -z "$reference" ]; then
      reference=$print; first=$name
    elif [ "$print" != "$reference" ]; then
      echo "FAIL $name differs from $first (losses and norms, model: $print vs $reference)"
      failed=1
    fi
  done
  echo "$set: dp:microbatches $layouts $reference"
done <<< "$sets"

# without it the sums follow the layout: the same check sees tp 2 on dp 2 differ from dp 1
run off_dp1 2 --tp 2 --dp 1 && run off_dp2 4 --tp 2 --dp 2 &&
  if [ "$(fingerprint "$scratch/off_dp1")" = "$(fingerprint "$scratch/off_dp2")" ]; then
    echo "FAIL deterministic off: tp 2 on dp 2 gave dp 1's bits, so this test cannot tell"
    failed=1
  fi
[ $failed = 0 ] && echo "deterministic_mp: ok"
exit $failed
