#!/usr/bin/env bash
# Sharded corpora end to end: `data text --shard_tokens` (2-byte BPE ids and byte tokens) trains
# bitwise as the single files it was split from (same seed), with prefetch on and off;
# `data inspect` prints the counts, tokenizer and a decoded excerpt; a token beyond the
# vocabulary in a shard and a shard index that disagrees with its files fail with one message.
# Usage: bash tests/cli/data_shards.sh path/to/meshtrain
set -u

if [[ $# -ne 1 || ! -x $1 ]]; then
    echo "usage: $0 path/to/meshtrain" >&2
    exit 2
fi
MT=$1
untimed="$(cd "$(dirname "$0")/../../scripts" && pwd)/untimed_metrics.sh"
WORK=$(mktemp -d /tmp/mt_data_shards.XXXXXX) || exit 2
trap 'rm -rf -- "$WORK"' EXIT
failed=0
fail() {
    echo "FAIL: $*" >&2
    failed=1
}
# Two microbatches, so that the prefetch queue holds several per step.
TINY=(--vocab 300 --layers 1 --width 16 --heads 2 --context 16 --batch 8 --microbatches 2
      --steps 6 --warmup 2 --eval_every 3 --eval_seqs 8 --sample_tokens 0 --threads 1
      --log_every 100)

/usr/bin/python3 - "$WORK" <<'PY'
import random, sys
random.seed(11)
words = ("in the beginning god created the heaven and the earth and the earth was without "
         "form and void").split()
for name in ("a.txt", "b.txt", "c.txt"):
    with open(f"{sys.argv[1]}/{name}", "w") as out:
        for _ in range(120):
            out.write(" ".join(random.choice(words) for _ in range(10)) + ".\n")
PY
texts=("$WORK/a.txt" "$WORK/b.txt" "$WORK/c.txt")
timeout 20 "$MT" tokenizer train "${texts[@]}" --vocab 300 --out "$WORK/tok.json" >/dev/null 2>&1 ||
    fail "tokenizer train"
timeout 20 "$MT" data text "${texts[@]}" --tokenizer "$WORK/tok.json" --out "$WORK/single" \
    >/dev/null || fail "data text (single files)"
timeout 20 "$MT" data text "${texts[@]}" --tokenizer "$WORK/tok.json" --out "$WORK/sharded" \
    --shard_tokens 500 >"$WORK/write.log" || fail "data text --shard_tokens"
[[ ! -e $WORK/sharded/train.bin && -f $WORK/sharded/train/index.json && -f $WORK/sharded/val/000000.bin ]] ||
    fail "the sharded folder holds $(cd "$WORK/sharded" && find . | tr '\n' ' ')"
shards=$(ls "$WORK/sharded/train" | grep -c '\.bin$')
((shards >= 4)) || fail "$shards training shards of 500 tokens: too few to test anything"
# the shards, back to back, are train.bin's tokens (after each file's 32-byte header)
cmp -s <(tail -c +33 "$WORK/single/train.bin") \
       <(for f in "$WORK"/sharded/train/*.bin; do tail -c +33 "$f"; done) ||
    fail "the training shards are not train.bin cut in pieces"

# same_training A B: bitwise the same losses, norms, validation losses and final model
same_training() {
    cmp -s "$1/model.safetensors" "$2/model.safetensors" &&
        cmp -s <("$untimed" "$1/metrics.jsonl") <("$untimed" "$2/metrics.jsonl")
}
train() { # NAME DATA ARGS...
    local name=$1 data=$2
    shift 2
    timeout 60 "$MT" train "${TINY[@]}" --data "$data" --out "$WORK/$name" "$@" \
        >"$WORK/$name.log" 2>&1 || fail "train $name: $(tail -3 "$WORK/$name.log")"
}
train single "$WORK/single"
train sharded "$WORK/sharded"
train sharded_sync "$WORK/sharded" --prefetch 0
train single_deep "$WORK/single" --prefetch 16
same_training "$WORK/single" "$WORK/sharded" ||
    fail "the sharded corpus trained differently from its single files (same seed)"
same_training "$WORK/sharded" "$WORK/sharded_sync" || fail "prefetch on and off trained differently"
same_training "$WORK/single" "$WORK/single_deep" || fail "--prefetch 16 trained differently"
grep -q '"data_ms": [0-9]' "$WORK/sharded/metrics.jsonl" || fail "metrics.jsonl has no data_ms"
grep -q '"data_ms": [0-9]' "$WORK/sharded/summary.json" || fail "summary.json has no data_ms"

# inspect: counts that agree with meta.json, the tokenizer, an excerpt decoded to the text
"$MT" data inspect "$WORK/sharded" --excerpt 12 >"$WORK/inspect.out" 2>&1 ||
    fail "data inspect: $(cat "$WORK/inspect.out")"
train_tokens=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["train_tokens"])' "$WORK/sharded/meta.json")
grep -q "^train: $train_tokens tokens in $shards shards (2-byte tokens, vocabulary bound 300), 2 end-of-text tokens" "$WORK/inspect.out" ||
    fail "inspect's train line: $(grep '^train' "$WORK/inspect.out")"
grep -q '^val: [0-9]* tokens in [0-9]* shards* (2-byte' "$WORK/inspect.out" || fail "inspect's val line"
grep -q ", 3 documents (files)" "$WORK/inspect.out" || fail "inspect's documents"
grep -q "^tokenizer: $WORK/tok.json (vocabulary 300, end-of-text 299)" "$WORK/inspect.out" ||
    fail "inspect's tokenizer line"
excerpt=$(sed -n '/^excerpt/{n;p}' "$WORK/inspect.out")
[[ -n $excerpt && $(head -c ${#excerpt} "$WORK/a.txt") == "$excerpt" ]] ||
    fail "inspect's excerpt '$excerpt' is not the start of the text"
timeout 20 "$MT" data text "$WORK/a.txt" --out "$WORK/bytes" --shard_tokens 1000 >/dev/null &&
    "$MT" data inspect "$WORK/bytes" >"$WORK/bytes.out" 2>&1 || fail "byte shards: $(cat "$WORK/bytes.out")"
grep -q "(1-byte tokens, vocabulary bound 256)" "$WORK/bytes.out" &&
    grep -qF "$(head -c 40 "$WORK/a.txt")" "$WORK/bytes.out" || fail "byte corpus inspect: $(cat "$WORK/bytes.out")"

# expect_error NAME PHRASE COMMAND...: exit 1 or 2, the last stderr line holding PHRASE.
expect_error() {
    local name=$1 phrase=$2
    shift 2
    timeout 60 "$@" >"$WORK/out" 2>"$WORK/err" </dev/null
    local status=$?
    if [[ $status != 1 && $status != 2 ]]; then
        fail "$name: exit status $status, want 1 or 2"
    elif ! tail -1 "$WORK/err" | grep -qF -- "$phrase"; then
        fail "$name: stderr '$(cat "$WORK/err")' does not end naming '$phrase'"
    fi
}
broken() { # NAME: a fresh copy of the sharded corpus
    rm -rf "$WORK/$1"
    cp -r "$WORK/sharded" "$WORK/$1"
    echo "$WORK/$1"
}
# a token beyond the vocabulary: 0xffff everywhere in the third shard, so a step draws it
d=$(broken beyond)
/usr/bin/python3 - "$d/train/000002.bin" <<'PY'
import sys
path = sys.argv[1]
data = bytearray(open(path, "rb").read())
data[32:] = b"\xff" * (len(data) - 32)
open(path, "wb").write(data)
PY
expect_error "inspect: token beyond the vocabulary" \
    "token file '$d/train/000002.bin': token 65535 at index 0 is not below the vocabulary bound 300" \
    "$MT" data inspect "$d"
for prefetch in 4 0; do
    expect_error "train --prefetch $prefetch: token beyond the vocabulary" \
        "'$d/train/000002.bin': token 65535 at index" \
        "$MT" train "${TINY[@]}" --steps 40 --data "$d" --out "$WORK/beyond.run" --prefetch "$prefetch"
done
d=$(broken missing)
rm "$d/train/000001.bin"
expect_error "missing shard" "shard '$d/train/000001.bin' is missing" "$MT" data inspect "$d"
expect_error "train: missing shard" "shard '$d/train/000001.bin' is missing" \
    "$MT" train "${TINY[@]}" --data "$d" --out "$WORK/missing.run"
d=$(broken short)
truncate -s -2 "$d/train/000003.bin"
expect_error "shard shorter than its index says" "shard '$d/train/000003.bin' holds 1030 bytes, the index says 1032" \
    "$MT" data inspect "$d"
d=$(broken count)
/usr/bin/python3 - "$d/val/index.json" <<'PY'
import json, sys
index = json.load(open(sys.argv[1]))
index["shards"][0]["tokens"] -= 1
json.dump(index, open(sys.argv[1], "w"))
PY
expect_error "shard count disagrees with the index" "the index says" "$MT" data inspect "$d"
d=$(broken stray)
cp "$d/train/000000.bin" "$d/train/000099.bin"
expect_error "shard not in the index" "shard file '$d/train/000099.bin' is not in the index" \
    "$MT" data inspect "$d"
d=$(broken both)
cp "$WORK/single/train.bin" "$d/train.bin"
expect_error "both layouts" "holds both" "$MT" data inspect "$d"
# writing single files over a sharded folder leaves one layout
timeout 20 "$MT" data text "${texts[@]}" --out "$d" >/dev/null && "$MT" data inspect "$d" >/dev/null 2>&1 ||
    fail "single files written over shards do not open"

[[ $failed == 0 ]] && echo "data_shards: ok"
exit $failed
