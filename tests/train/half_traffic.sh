#!/usr/bin/env bash
# Half-size traffic over tcp (mt_comm_bytes_sent, metrics.jsonl's wire_bytes and comm_bytes):
# bf16 training sends at most 55% of fp32's bytes on the pipeline group and, with --grad_reduce
# bf16 too, ZeRO-3's data-parallel group; --grad_reduce bf16 halves DDP's bytes in fp32 training.
# Tensor parallelism sends its gathers of the norms' bf16 rows as bf16 and its sums as fp32
# (docs/architecture.md's precision section says why).
# usage: half_traffic.sh MESHTRAIN
#
# Every collective and transfer of these groups moves bf16 under bf16 except small fp32 ones
# (a pipeline's loss broadcast, ZeRO-3's root gathered once a step and its norms and biases,
# frame headers), so 50-52% of fp32's; a collective left in fp32
# keeps the ratio near 100% for its group, and 55% leaves room for the headers alone.
set -euo pipefail
meshtrain=$1
source "$(dirname "$0")/genesis_setup.sh"
export MT_COMM_BACKEND=tcp
limit=0.55
job=(--data "$scratch/data" --vocab 256 --context 32 --layers 4 --heads 4 --width 64
     --batch 8 --steps 2 --warmup 1 --eval_every 0 --sample_tokens 0 --threads 1)
failed=0

# total OUT KIND GROUP: KIND.GROUP summed over the run's steps
total() {
  python3 -c 'import json, sys
print(sum(json.loads(l)[sys.argv[2]][sys.argv[3]] for l in open(sys.argv[1] + "/metrics.jsonl")))' \
    "$1" "$2" "$3"
}

# check NAME KIND GROUP LIMIT "FP32 ARGS" "HALF ARGS": both runs, then half / fp32 <= LIMIT
check() {
  local name=$1 kind=$2 group=$3 most=$4 base=$5 half=$6
  for variant in base half; do
    local args=${!variant}
    # shellcheck disable=SC2086
    if ! timeout 120 "$meshtrain" train "${job[@]}" $args --out "$scratch/${name}_$variant" \
        > "$scratch/${name}_$variant.log" 2>&1; then
      echo "FAIL $name: the $variant run failed"; tail -n 20 "$scratch/${name}_$variant.log"
      failed=1; return 0
    fi
  done
  local a b
  a=$(total "$scratch/${name}_base" "$kind" "$group")
  b=$(total "$scratch/${name}_half" "$kind" "$group")
  if python3 -c 'import sys; a, b, m = map(float, sys.argv[1:]); sys.exit(not (a > 0 and b <= m * a))' \
      "$a" "$b" "$most"; then
    echo "ok   $name: $kind.$group $b of $a bytes ($(python3 -c "print(f'{$b / $a:.3f}')"))"
  else
    echo "FAIL $name: $kind.$group $b of $a bytes, above $most"; failed=1
  fi
}

check pp2 wire_bytes pp $limit "--nproc 2 --pp 2 --microbatches 2" \
  "--nproc 2 --pp 2 --microbatches 2 --precision bf16"
check zero3 wire_bytes dp $limit "--nproc 2 --zero 3" \
  "--nproc 2 --zero 3 --precision bf16 --grad_reduce bf16"
check ddp wire_bytes dp $limit "--nproc 2" "--nproc 2 --grad_reduce bf16"
# tensor parallelism with sequence parallelism: the norms' rows are gathered as bf16 (they are
# bf16 values), its sums stay fp32, so its bytes fall by the gathers' half (about 1/8 of them);
# 0.95 fails if the gathers still travel as fp32
check tp2_sp wire_bytes tp 0.95 "--nproc 2 --tp 2 --sp on" "--nproc 2 --tp 2 --sp on --precision bf16"
# the gradient bytes handed to the group: exactly 2 per element instead of 4
a=$(total "$scratch/ddp_base" comm_bytes dp) b=$(total "$scratch/ddp_half" comm_bytes dp)
if python3 -c 'import sys; a, b = map(float, sys.argv[1:]); sys.exit(not (a > 0 and 2 * b == a))' "$a" "$b"; then
  echo "ok   ddp: comm_bytes.dp $b of $a"
else
  echo "FAIL ddp: comm_bytes.dp $b is not half of $a"; failed=1
fi
exit $failed
