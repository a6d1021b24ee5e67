#!/usr/bin/env bash
# Half-precision interchange: `meshtrain export --dtype bf16|f16` writes each checkpoint value
# rounded as PyTorch rounds it (round to nearest even), `train --init` reads BF16 and F16 files
# to exactly their values, and a file with an unknown dtype or a truncated BF16 tensor is one
# clear error naming the file and the tensor. One process, a few seconds.
# usage: export_dtype.sh MESHTRAIN
set -euo pipefail
meshtrain=$1
source "$(dirname "$0")/genesis_setup.sh"
source "$here/expect.sh"
check=(/usr/bin/python3 "$here/export_dtype.py")

job=(--data "$scratch/data" --vocab 257 --context 16 --layers 2 --heads 2 --width 16
     --batch 4 --warmup 2 --lr 5e-3 --eval_every 0 --sample_tokens 0 --threads 1)
train_into "$scratch/src" --steps 3 --save_every 3 || exit 1

"$meshtrain" export --ckpt "$scratch/src" --out "$scratch/f32.safetensors" > /dev/null || fail "export f32"
for dtype in bf16 f16; do
  "$meshtrain" export --ckpt "$scratch/src" --dtype $dtype --out "$scratch/$dtype.safetensors" \
    > "$scratch/export.log" || fail "export --dtype $dtype"
  grep -q "GPT-2 names, ${dtype^^}" "$scratch/export.log" || fail "export --dtype $dtype: no dtype in its report"
  # lr 0: one step changes nothing, so OUT/model.safetensors is what --init loaded
  train_into "$scratch/init_$dtype" --init "$scratch/$dtype.safetensors" --steps 1 --lr 0 --min_lr 0 || true
done
"${check[@]}" check "$scratch" || failed=1
must_fail "--dtype 'f8': expected f32, bf16 or f16" "$meshtrain" export --ckpt "$scratch/src" --dtype f8 --out "$scratch/x.safetensors"

# bad files: each error names the file and the tensor
"${check[@]}" baddtype "$scratch/bf16.safetensors" "$scratch/f7.safetensors"
must_fail "f7.safetensors': tensor '[a-z0-9_.]+': unknown dtype 'F7'" \
  "$meshtrain" train "${job[@]}" --init "$scratch/f7.safetensors" --steps 1 --out "$scratch/bad1"
size=$(stat -c %s "$scratch/bf16.safetensors")
head -c $((size - 6)) "$scratch/bf16.safetensors" > "$scratch/cut.safetensors"
must_fail "cut.safetensors': tensor '[a-z0-9_.]+': .*past the data area" \
  "$meshtrain" train "${job[@]}" --init "$scratch/cut.safetensors" --steps 1 --out "$scratch/bad2"
[ $failed = 0 ] && echo "ok export --dtype bf16/f16 rounds as PyTorch does; --init reads them exactly; bad files named"
exit $failed
