#!/usr/bin/env bash
# --deterministic on: what it costs on the default job at dp 2 (tokens/s, on against off in
# paired runs, each pair timed back to back), and the issue's whole bitwise matrix (dp 1, 2, 4 x
# microbatches 1, 4 x ZeRO 0, 3 x 1 and 2 threads per rank, 20 steps) through
# tests/train/deterministic.sh, and the tensor- and pipeline-parallel matrix (tp 2 with and
# without sp, pp 2 on gpipe, 1f1b and interleaved, dp 2 x tp 2 x pp 2 against dp 1: dp 1, 2 x
# the micro-batch counts the schedule accepts, ZeRO 0, 1 and 3, 20 steps) through
# tests/train/deterministic_mp.sh. Run under `flock /work/wt/heavy.lock` on a shared machine.
# usage: bench/deterministic/run.sh [--pairs 3] [--steps 60] [--build build] [--no-matrix]
set -euo pipefail
cd "$(dirname "$0")/../.."
pairs=3 steps=60 build=build matrix=1
while [ $# -gt 0 ]; do
  case $1 in
    --pairs) pairs=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --no-matrix) matrix=0; shift ;;
    *) echo "usage: $0 [--pairs N] [--steps N] [--build DIR] [--no-matrix]" >&2; exit 2 ;;
  esac
done
meshtrain=$build/meshtrain
[ -f data/kjv/train.bin ] || "$meshtrain" data kjv --out data/kjv > /dev/null
work=$build/bench_deterministic
mkdir -p "$work"
field() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1" "$2"; }

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; $(date -u +%F)"
echo "job: $meshtrain train --config configs/default.ini --nproc 2 --steps $steps --eval_every 0 --sample_tokens 0 --deterministic off|on"
printf '%-6s %12s %12s %8s\n' pair off_tok/s on_tok/s on/off
ratios=()
for pair in $(seq 1 "$pairs"); do
  declare -A rate=()
  # alternate which goes first, so a drift of the machine's load falls on both
  order="off on"; [ $((pair % 2)) = 0 ] && order="on off"
  for mode in $order; do
    out=$work/$mode$pair
    "$meshtrain" train --config configs/default.ini --nproc 2 --steps "$steps" --eval_every 0 \
      --sample_tokens 0 --deterministic "$mode" --out "$out" > "$out.log" 2>&1
    rate[$mode]=$(field "$out/summary.json" tokens_per_s)
  done
  ratio=$(python3 -c "print(f'{${rate[on]} / ${rate[off]}:.3f}')")
  ratios+=("$ratio")
  printf '%-6s %12.0f %12.0f %8s\n' "$pair" "${rate[off]}" "${rate[on]}" "$ratio"
  cmp -s "$work/off$pair/model.safetensors" "$work/on$pair/model.safetensors" &&
    echo "  (on and off gave the same model)"
done
echo "median on/off: $(printf '%s\n' "${ratios[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')"

if [ "$matrix" = 1 ]; then
  echo "bitwise matrix, 20 steps:"
  MT_DETERMINISTIC_STEPS=20 MT_DETERMINISTIC_LAYOUTS="$(for d in 1 2 4; do for m in 1 4; do
      for t in 1 2; do printf '%s:%s:%s ' $d $m $t; done; done; done)" \
    bash tests/train/deterministic.sh "$meshtrain"
  echo "tensor- and pipeline-parallel matrix, 20 steps:"
  sets=""
  for zero in 0 3; do
    for sp in off on; do
      sets+="tp2_sp${sp}_zero$zero|2|--tp 2 --sp $sp --zero $zero|1:1 1:4 2:1 2:4"$'\n'
    done
  done
  for zero in 0 1 3; do
    for schedule in gpipe 1f1b; do
      sets+="pp2_${schedule}_zero$zero|2|--pp 2 --schedule $schedule --zero $zero|1:2 1:4 2:2 2:4"$'\n'
    done
  done
  sets+="pp2_interleaved_zero3|2|--pp 2 --schedule interleaved --chunks 2 --layers 4 --zero 3|1:2 1:4 2:2 2:4"$'\n'
  sets+="tp2_sp_pp2_zero1|4|--tp 2 --sp on --pp 2 --zero 1|1:2 1:4 2:2 2:4"
  MT_DETERMINISTIC_STEPS=20 MT_DETERMINISTIC_SETS="$sets" \
    bash tests/train/deterministic_mp.sh "$meshtrain"
fi
