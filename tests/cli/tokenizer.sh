#!/usr/bin/env bash
# `meshtrain tokenizer` end to end on a trained tokenizer: train on the KJV (three times, on one
# CPU and on all, one and two OpenMP threads: the same tok.json), encode and decode back byte
# for byte, and bad input failing with one clear message.
# Usage: bash tests/cli/tokenizer.sh path/to/meshtrain
set -u

if [[ $# -ne 1 || ! -x $1 ]]; then
    echo "usage: $0 path/to/meshtrain" >&2
    exit 2
fi
MT=$1
if ! command -v bible >/dev/null; then
    echo "tokenizer: FAIL: the KJV needs the bible program (apt-get install bible-kjv)" >&2
    exit 1
fi
WORK=$(mktemp -d /tmp/mt_tokenizer.XXXXXX) || exit 2
trap 'rm -rf -- "$WORK"' EXIT
failed=0
fail() {
    echo "FAIL: $*" >&2
    failed=1
}

bible -f gen1:1-rev22:21 >"$WORK/kjv.txt" 2>/dev/null
"$MT" tokenizer train "$WORK/kjv.txt" --vocab 2048 --out "$WORK/a.json" 2>"$WORK/train.log" ||
    fail "train: $(cat "$WORK/train.log")"
cat "$WORK/train.log"
# training is one thread whatever the settings (the KJV takes a fraction of a second); the same
# merges on one CPU and one thread as on every CPU with two
OMP_NUM_THREADS=2 "$MT" tokenizer train "$WORK/kjv.txt" --vocab 2048 --out "$WORK/b.json" 2>/dev/null
cmp -s "$WORK/a.json" "$WORK/b.json" || fail "two trainings on the KJV wrote different files"
if command -v taskset >/dev/null; then
    OMP_NUM_THREADS=1 taskset -c 0 "$MT" tokenizer train "$WORK/kjv.txt" --vocab 2048 \
        --out "$WORK/c.json" 2>/dev/null
    cmp -s "$WORK/a.json" "$WORK/c.json" || fail "training on one CPU wrote a different file"
fi
"$MT" tokenizer encode --tokenizer "$WORK/a.json" <"$WORK/kjv.txt" >"$WORK/kjv.ids" ||
    fail "encode from standard input"
"$MT" tokenizer decode --tokenizer "$WORK/a.json" "$WORK/kjv.ids" | cmp -s - "$WORK/kjv.txt" ||
    fail "decode does not give the KJV back"
ids=$(wc -w <"$WORK/kjv.ids")
((ids > 0 && ids < $(wc -c <"$WORK/kjv.txt") / 3)) || fail "$ids ids for the KJV: too many"

# expect_error NAME PHRASE COMMAND...: exit 1 or 2, one line on stderr holding PHRASE.
expect_error() {
    local name=$1 phrase=$2
    shift 2
    "$@" >"$WORK/out" 2>"$WORK/err" </dev/null
    local status=$?
    if [[ $status != 1 && $status != 2 ]]; then
        fail "$name: exit status $status, want 1 or 2"
    elif ! grep -qF -- "$phrase" "$WORK/err" || [[ $(wc -l <"$WORK/err") != 1 ]]; then
        fail "$name: stderr '$(cat "$WORK/err")' is not one line naming '$phrase'"
    fi
}
printf '{"version":1,"vocab_size":259,"merges":[[104,105],[104,105]],"eot":258}' >"$WORK/dup.json"
printf '{"version":1,"vocab_size":258,"merges":[[104,' >"$WORK/cut.json"
printf '5 70000\n' >"$WORK/big.ids"
printf '5 x7\n' >"$WORK/word.ids"
expect_error "no --tokenizer" "needs --tokenizer" "$MT" tokenizer encode "$WORK/kjv.txt"
expect_error "missing tokenizer" "$WORK/none.json" "$MT" tokenizer encode --tokenizer "$WORK/none.json"
expect_error "duplicate merge" "repeats merge 0" "$MT" tokenizer encode --tokenizer "$WORK/dup.json"
expect_error "truncated file" "$WORK/cut.json" "$MT" tokenizer decode --tokenizer "$WORK/cut.json"
expect_error "missing gpt2 folder" "$WORK/nogpt2/encoder.json" "$MT" tokenizer encode --tokenizer "gpt2:$WORK/nogpt2"
expect_error "missing input" "$WORK/none.txt" "$MT" tokenizer encode --tokenizer "$WORK/a.json" "$WORK/none.txt"
expect_error "id beyond vocabulary" "not an id below 2048" "$MT" tokenizer decode --tokenizer "$WORK/a.json" "$WORK/big.ids"
expect_error "not an id" "'x7'" "$MT" tokenizer decode --tokenizer "$WORK/a.json" "$WORK/word.ids"
expect_error "small vocab" "--vocab" "$MT" tokenizer train "$WORK/kjv.txt" --vocab 10 --out "$WORK/c.json"
expect_error "no files" "needs FILE" "$MT" tokenizer train --vocab 300 --out "$WORK/c.json"
expect_error "missing training file" "$WORK/none.txt" "$MT" tokenizer train "$WORK/none.txt" --vocab 300 --out "$WORK/c.json"
expect_error "unknown verb" "unknown verb" "$MT" tokenizer frobnicate
((failed)) || echo "tokenizer: ok ($ids ids for the KJV)"
exit $failed
