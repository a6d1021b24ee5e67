#!/usr/bin/env bash
# `meshtrain generate` on one process: the cache against the full recompute while sampling
# (temperature, top-k, top-p), the sliding window past the context, a trained tokenizer, a
# prompt file, and bad input (a prompt longer than the context, an unknown model path, --top_p
# outside (0, 1], a model of more than 256 tokens without --tokenizer, a layout the model cannot
# take), each a clear message.
# usage: cli.sh MESHTRAIN
set -euo pipefail
meshtrain=$1
source "$(dirname "$0")/tiny_model.sh"
model=$scratch/run/model.safetensors
failed=0
fail() { echo "FAIL: $*"; failed=1; }

sampled=(--prompt "And God said" --tokens 20 --temperature 0.9 --top_k 20 --top_p 0.9 --seed 7
         --threads 1)
"$meshtrain" generate "$model" "${sampled[@]}" --no_cache --dump "$scratch/full.bin" \
  > /dev/null 2>&1
"$meshtrain" generate "$model" "${sampled[@]}" --dump "$scratch/cached.bin" > /dev/null 2>&1
python3 "$here/compare_dumps.py" "$scratch/full.bin" "$scratch/cached.bin" 256 1e-5 5 || failed=1

# past the context of 32: the window slides, every token comes
printf 'In the beginning' > "$scratch/prompt.txt"
"$meshtrain" generate "$model" --prompt_file "$scratch/prompt.txt" --tokens 70 --threads 1 \
  --dump "$scratch/long.bin" > "$scratch/long.txt" 2>&1
[ "$(stat -c %s "$scratch/long.bin")" -eq $((70 * (4 + 4 * 256))) ] ||
  fail "70 tokens past the context: $(stat -c %s "$scratch/long.bin") bytes of dump"
head -c 16 "$scratch/long.txt" | grep -q '^In the beginning' || fail "the prompt is not echoed"

# a BPE model: its tokenizer encodes the prompt and decodes the stream
"$meshtrain" tokenizer train "$scratch/genesis.txt" --vocab 300 --out "$scratch/tok.json" \
  > /dev/null 2>&1
"$meshtrain" data text "$scratch/genesis.txt" --tokenizer "$scratch/tok.json" \
  --out "$scratch/bpe" > /dev/null
"$meshtrain" train --data "$scratch/bpe" --vocab 300 --context 32 --batch 8 --steps 5 \
  --layers 2 --heads 2 --width 32 --eval_every 0 --sample_tokens 0 --threads 1 \
  --out "$scratch/bpe_run" > /dev/null 2>&1
bpe=$scratch/bpe_run/model.safetensors
"$meshtrain" generate "$bpe" --tokenizer "$scratch/tok.json" --prompt "And God" --tokens 10 \
  --threads 1 > "$scratch/bpe.txt" 2>&1 || fail "generate with --tokenizer: $(cat "$scratch/bpe.txt")"

# bad input: exit status and message
expect_error() {
  local needle=$1
  shift
  if "$meshtrain" generate "$@" > "$scratch/bad.txt" 2>&1; then
    fail "generate $* succeeded"
  elif ! grep -q -- "$needle" "$scratch/bad.txt"; then
    fail "generate $*: no '$needle' in: $(cat "$scratch/bad.txt")"
  fi
}
expect_error "longer than the model's context of 32" "$model" --threads 1 \
  --prompt "In the beginning God created the heaven and the earth."
expect_error "MODEL '$scratch/nowhere'" "$scratch/nowhere" --prompt x
expect_error "MODEL '$scratch/nowhere'" "$scratch/nowhere" --prompt x --nproc 2 --tp 2
expect_error "--top_p '0' is not in (0, 1]" "$model" --prompt x --top_p 0
expect_error "--top_p '1.5' is not in (0, 1]" "$model" --prompt x --top_p 1.5
expect_error "give --tokenizer" "$bpe" --prompt x --threads 1
expect_error "one of --prompt" "$model"
expect_error "tp 3 does not divide the 4 attention heads" "$model" --prompt x --nproc 3 --tp 3
exit $failed
