#!/usr/bin/env bash
# Runs mt_ref_dump for several GPT shapes and checks each dump against PyTorch (float64)
# with check_gpt.py: logits, loss, every gradient, and parameters after 3 AdamW steps.
set -euo pipefail
dump_program=$1
checker=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# vocab context layers heads width batch seq
shapes=(
  "256 37 2 3 60 3 37"    # 3 heads of 20, context 37: nothing a power of two
  "300 150 2 5 40 2 130"  # 130 positions: three blocks of the causal attention kernel
  "97 16 3 4 32 4 11"     # a sequence shorter than the context
)
failed=0
for shape in "${shapes[@]}"; do
  echo "== shape (vocab context layers heads width batch seq): $shape"
  # shellcheck disable=SC2086
  timeout 120 "$dump_program" "$work/dump.bin" $shape
  if ! timeout 120 /usr/bin/python3 "$checker" "$work/dump.bin" | tail -n 12; then
    failed=$((failed + 1))
  fi
done
echo "parity: $(( ${#shapes[@]} - failed )) passed, $failed failed"
[ "$failed" = 0 ]
