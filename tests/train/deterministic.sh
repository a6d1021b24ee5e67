#!/usr/bin/env bash
# --deterministic on gives the same bits on any dp and micro-batch count: dp 1, 2, 4 x
# microbatches 1, 4 within ZeRO 0 and within ZeRO 3, on 1 thread per rank and some on 2 (and dp
# 4 over tcp, whose rings sum in another order than shm), must log the same losses and gradient
# norms and write byte-identical model.safetensors. Without it dp 2 differs from one process (so
# the comparison can tell). bench/deterministic/run.sh runs
# the issue's whole matrix (20 steps, every run on 1 and 2 threads) and the cost.
# usage: deterministic.sh MESHTRAIN [SCRATCH]
set -euo pipefail
meshtrain=$1
scratch=${2:-}
source "$(dirname "$0")/genesis_setup.sh"
# two threads per rank on a small machine: sleeping, not spinning, while a peer computes
export OMP_WAIT_POLICY=passive

job=(--data "$scratch/data" --vocab 256 --context 16 --layers 2 --heads 4 --width 64
     --batch 16 --steps ${MT_DETERMINISTIC_STEPS:-8} --warmup 2 --lr 3e-3 --eval_every 0
     --sample_tokens 0 --check_every 4)

# the per-step losses and gradient norms as logged, then the model's bytes
fingerprint() {
  grep -o '"loss": [^,]*, "lr": [^,]*, "grad_norm": [^,]*' "$1/metrics.jsonl" | md5sum | cut -c1-12
  md5sum < "$1/model.safetensors" | cut -c1-12
}

failed=0
run() { # name, then train flags
  local name=$1; shift
  if ! "$meshtrain" train "${job[@]}" "$@" --out "$scratch/$name" > "$scratch/$name.log" 2>&1; then
    echo "FAIL $name: the run failed"; cat "$scratch/$name.log"; failed=1; return 1
  fi
}

# dp:microbatches:threads[:back end]; tcp's rings sum in another order than shm's
layouts=${MT_DETERMINISTIC_LAYOUTS:-"1:1:1 2:1:1 4:1:1 1:4:1 2:4:1 4:4:1 1:1:2 2:1:2 4:4:2 4:1:1:tcp"}
for zero in 0 3; do
  reference=""
  for layout in $layouts; do
    IFS=: read -r dp micro threads backend <<< "$layout"
    name="zero${zero}_dp${dp}_m${micro}_t${threads}${backend:+_$backend}"
    MT_COMM_BACKEND=${backend:-shm} run "$name" --deterministic on --zero $zero --nproc $dp \
      --microbatches $micro --threads $threads || continue
    print=$(fingerprint "$scratch/$name" | tr '\n' ' ')
    if [ -z "$reference" ]; then
      reference=$print; first=$name
    elif [ "$print" != "$reference" ]; then
      echo "FAIL $name differs from $first (losses and norms, model: $print vs $reference)"
      failed=1
    fi
  done
  echo "zero $zero: $(echo $layouts | wc -w) layouts (dp:microbatches:threads $layouts) $reference"
done

# OpenBLAS's threaded products round otherwise than its single-threaded ones at larger shapes
# (the job above is too small for it to split them): 128 tokens per pass, 1 and 2 threads
wide=(--context 128 --steps 3 --deterministic on --zero 0)
run wide_t1 "${wide[@]}" --threads 1 && run wide_t2 "${wide[@]}" --threads 2 &&
  if [ "$(fingerprint "$scratch/wide_t1")" != "$(fingerprint "$scratch/wide_t2")" ]; then
    echo "FAIL context 128: 2 threads differ from 1"; failed=1
  fi

# without it the sums follow the layout: the same check sees dp 2 differ from one process
run off_dp1 --zero 0 --threads 1 && run off_dp2 --zero 0 --threads 1 --nproc 2 &&
  if [ "$(fingerprint "$scratch/off_dp1")" = "$(fingerprint "$scratch/off_dp2")" ]; then
    echo "FAIL deterministic off: dp 2 gave one process's bits, so this test cannot tell"
    failed=1
  fi
[ $failed = 0 ] && echo "deterministic: ok"
exit $failed
