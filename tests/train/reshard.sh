#!/usr/bin/env bash
# Checkpoints across 3D layouts: a dp2 x pp2 x tp2 checkpoint with sequence parallelism (and a
# vocabulary tp pads) loads on one process, tp4, pp4, dp4 x zero 3 and interleaved tp2 x pp2,
# and each of those back on the 3D layout, with parameters and Adam moments bitwise the saved
# ones; training continued from it on each layout matches one process's within 1e-5 relative.
# usage: reshard.sh MESHTRAIN [quick]   (quick: one process and tp2 x pp2, for the sanitizers)
set -euo pipefail
meshtrain=$1
quick=${2:-}
source "$(dirname "$0")/genesis_setup.sh"
check=(/usr/bin/python3 "$here/ckpt_tensors.py")
source "$here/expect.sh"

# Four layers of four heads, so that pp4 and tp4 both fit; vocabulary 257 is padded under tp.
job=(--data "$scratch/data" --vocab 257 --context 16 --layers 4 --heads 4 --width 32
     --batch 24 --steps 12 --warmup 2 --lr 5e-4 --eval_every 6 --eval_seqs 11
     --sample_tokens 0 --threads 1 --save_every 6)
declare -A layouts=(
  [one]=""
  [tp4]="--nproc 4 --tp 4 --sp on"
  [pp4]="--nproc 4 --pp 4 --microbatches 8"
  [dp4z3]="--nproc 4 --zero 3"
  [tp2pp2]="--nproc 4 --tp 2 --pp 2 --microbatches 4 --schedule interleaved --chunks 2"
)
mesh="--nproc 8 --dp 2 --pp 2 --tp 2 --sp on --microbatches 2 --zero 1"
targets=(one tp4 pp4 dp4z3 tp2pp2)
if [ -n "$quick" ]; then
  mesh=${layouts[tp2pp2]}
  targets=(one)
fi

src="$scratch/src"
train_into "$src" --steps 6 $mesh || exit 1
saved="$src/ckpt/step_6"

# Loaded and saved again at once (a run with no step left to take saves its state), then the
# same from that copy back onto the 3D layout: both bitwise the original.
for name in "${targets[@]}"; do
  copy="$scratch/at_$name"
  train_into "$copy" --steps 6 --resume "$saved" ${layouts[$name]} || continue
  "${check[@]}" same "$saved" "$copy/ckpt/step_6" || fail "loaded on $name"
  back="$scratch/back_from_$name"
  train_into "$back" --steps 6 --resume "$copy/ckpt/step_6" $mesh || continue
  "${check[@]}" same "$saved" "$back/ckpt/step_6" || fail "back from $name"
done

# Training continued from the checkpoint: on every layout as on one process, within 1e-5.
reference="$scratch/continued_one"
train_into "$reference" --resume "$saved" || exit 1
for name in "${targets[@]}" mesh; do
  [ "$name" = one ] && continue
  run="$scratch/continued_$name"
  options=${layouts[$name]:-$mesh}
  train_into "$run" --resume "$saved" $options || continue
  /usr/bin/python3 "$here/compare_runs.py" "$reference" "$run" 1e-5 || fail "continued on $name"
done
exit $failed
