#!/usr/bin/env bash
# Generation through the key/value cache equals generation that reruns the whole window for
# every token (and that reference on one process), on one process, tp 2, pp 2 and tp 2 x pp 2:
# logits within 1e-5 and the same greedy tokens up to the first near-tie (compare_dumps.py).
# The prompt and tokens fill the context exactly, so every draw is inside it.
# usage: layouts.sh MESHTRAIN
set -euo pipefail
meshtrain=$1
source "$(dirname "$0")/tiny_model.sh"
ckpt=$scratch/run/ckpt/step_30
greedy=(--prompt "And God said" --tokens 20 --temperature 0 --threads 1)
"$meshtrain" generate "$ckpt" "${greedy[@]}" --no_cache --dump "$scratch/reference.bin" \
  > "$scratch/reference.txt"
failed=0
# case NAME ARGS...: a cached and an uncached generation on a layout, each against the reference
case_of() {
  local name=$1
  shift
  for mode in cached uncached; do
    local extra=()
    [ "$mode" = uncached ] && extra=(--no_cache)
    if ! timeout 120 "$meshtrain" generate "${greedy[@]}" "$@" "${extra[@]}" \
        --dump "$scratch/$name.$mode.bin" > "$scratch/$name.$mode.txt" 2> "$scratch/$name.log"; then
      echo "FAIL $name $mode: generate failed"; cat "$scratch/$name.log"; failed=1; continue
    fi
    python3 "$here/compare_dumps.py" "$scratch/reference.bin" "$scratch/$name.$mode.bin" 256 \
      1e-5 5 || failed=1
  done
}
case_of one "$ckpt"
case_of one_safetensors "$scratch/run/model.safetensors"
case_of tp2 "$ckpt" --nproc 2 --tp 2
case_of pp2 "$ckpt" --nproc 2 --pp 2
case_of tp2_pp2 "$ckpt" --nproc 4 --tp 2 --pp 2
exit $failed
