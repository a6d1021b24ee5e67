#!/usr/bin/env bash
# The end-of-training sample of a BPE corpus is text of the corpus's tokenizer (meta.json's):
# the same text `meshtrain generate` gives the saved model with that tokenizer and the run's
# settings. The end-of-text token ends generation and the sample (a model made to always draw
# it), `generate --ignore_eot` goes on printing it as <|endoftext|>, and a corpus whose
# tokenizer has gone is refused before training.
# Usage: bash tests/cli/bpe_sample.sh path/to/meshtrain
set -u

if [[ $# -ne 1 || ! -x $1 ]]; then
    echo "usage: $0 path/to/meshtrain" >&2
    exit 2
fi
MT=$1
WORK=$(mktemp -d /tmp/mt_bpe_sample.XXXXXX) || exit 2
trap 'rm -rf -- "$WORK"' EXIT
failed=0
fail() {
    echo "FAIL: $*" >&2
    failed=1
}
TINY=(--vocab 300 --context 32 --batch 8 --layers 2 --heads 2 --width 32 --eval_every 0
      --threads 1 --prompt "the lamb")

# Three documents of a few words (an end-of-text token between them), a tokenizer of 300 ids.
/usr/bin/python3 - "$WORK" <<'PY'
import random, sys
random.seed(3)
words = "the lamb and a light upon waters in beginning was word form void".split()
for name in "abc":
    with open(f"{sys.argv[1]}/{name}.txt", "w") as out:
        for _ in range(150):
            out.write(" ".join(random.choice(words) for _ in range(8)) + ".\n")
PY
texts=("$WORK/a.txt" "$WORK/b.txt" "$WORK/c.txt")
timeout 20 "$MT" tokenizer train "${texts[@]}" --vocab 300 --out "$WORK/tok.json" >/dev/null 2>&1 ||
    fail "tokenizer train"
timeout 20 "$MT" data text "${texts[@]}" --tokenizer "$WORK/tok.json" --out "$WORK/bpe" \
    >/dev/null 2>&1 || fail "data text --tokenizer"

# The sample's text (between its header and the done line) is generate's on the saved model.
sample_of() { sed -n '/^--- sample/,/^done:/p' "$1" | sed '1d;$d'; }
timeout 60 "$MT" train --data "$WORK/bpe" "${TINY[@]}" --steps 10 --seed 5 --sample_tokens 40 \
    --out "$WORK/run" >"$WORK/train.log" 2>&1 || fail "train: $(cat "$WORK/train.log")"
sample_of "$WORK/train.log" >"$WORK/sample.txt"
timeout 60 "$MT" generate "$WORK/run/model.safetensors" --tokenizer "$WORK/tok.json" --threads 1 \
    --prompt "the lamb" --tokens 40 --temperature 0.8 --top_k 40 --seed 5 >"$WORK/gen.txt" \
    2>"$WORK/gen.err" || fail "generate: $(cat "$WORK/gen.err")"
[[ -s $WORK/sample.txt ]] && cmp -s "$WORK/sample.txt" "$WORK/gen.txt" ||
    fail "the sample is not generate's text: $(od -c "$WORK/sample.txt" | head -5) vs $(od -c "$WORK/gen.txt" | head -5)"

# A model that always draws the end-of-text token (299): its final norm outputs a constant
# vector u (weight 0, bias u), and the token's embedding row is 20 u.
/usr/bin/python3 - "$WORK/run/model.safetensors" "$WORK/eot.safetensors" <<'PY' || fail "eot model"
import json, struct, sys
import numpy as np
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
data = bytearray(raw[8 + n:])
def tensor(name):
    begin, end = header[name]["data_offsets"]
    return np.frombuffer(data, dtype="<f4", count=(end - begin) // 4, offset=begin)
u = np.random.default_rng(1).standard_normal(32).astype("<f4")
u /= np.linalg.norm(u)
tensor("lnf.weight")[:] = 0
tensor("lnf.bias")[:] = u
tensor("wte.weight").reshape(300, 32)[299] = 20 * u
open(sys.argv[2], "wb").write(raw[:8 + n] + bytes(data))
PY
timeout 30 "$MT" generate "$WORK/eot.safetensors" --tokenizer "$WORK/tok.json" --threads 1 \
    --prompt "the lamb" --tokens 5 --temperature 0 >"$WORK/stop.txt" 2>"$WORK/stop.err" ||
    fail "generate to the end of text: $(cat "$WORK/stop.err")"
[[ $(cat "$WORK/stop.txt") == "the lamb" ]] || fail "generate did not stop at the end of text: $(cat "$WORK/stop.txt")"
grep -q "generated 1 tokens .*end-of-text" "$WORK/stop.err" || fail "no end-of-text in: $(cat "$WORK/stop.err")"
timeout 30 "$MT" generate "$WORK/eot.safetensors" --tokenizer "$WORK/tok.json" --threads 1 \
    --prompt "the lamb" --tokens 3 --temperature 0 --ignore_eot >"$WORK/past.txt" 2>"$WORK/past.err" ||
    fail "generate --ignore_eot: $(cat "$WORK/past.txt" "$WORK/past.err")"
[[ $(head -1 "$WORK/past.txt") == "the lamb<|endoftext|><|endoftext|><|endoftext|>" ]] ||
    fail "generate --ignore_eot: $(cat "$WORK/past.txt" "$WORK/past.err")"
# the sample of a run that leaves the model as it is (learning rate 0) stops there too
timeout 60 "$MT" train --data "$WORK/bpe" "${TINY[@]}" --init "$WORK/eot.safetensors" --steps 1 \
    --lr 0 --min_lr 0 --sample_tokens 20 --top_k 1 --out "$WORK/eot_run" >"$WORK/eot.log" 2>&1 ||
    fail "train --init eot model: $(cat "$WORK/eot.log")"
[[ $(sample_of "$WORK/eot.log") == $'the lamb\n--- end of text after 1 tokens ---' ]] ||
    fail "the sample did not stop at the end of text: $(sample_of "$WORK/eot.log")"

# meta.json's tokenizer gone: refused before any step, naming it and the way out
mv "$WORK/tok.json" "$WORK/moved.json"
if timeout 30 "$MT" train --data "$WORK/bpe" "${TINY[@]}" --steps 1 --out "$WORK/gone" \
    >"$WORK/gone.log" 2>&1; then
    fail "a corpus whose tokenizer is gone trained"
elif ! grep -q "sample's tokenizer, '$WORK/tok.json'.*--sample_tokens 0" "$WORK/gone.log" ||
    grep -q "^step" "$WORK/gone.log"; then
    fail "tokenizer gone: $(cat "$WORK/gone.log")"
fi
exit $failed
