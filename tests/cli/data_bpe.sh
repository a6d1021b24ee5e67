#!/usr/bin/env bash
# `meshtrain data text --tokenizer` end to end: a tokenizer trained on two small generated texts
# writes 2-byte token files that decode back to the texts, a meta.json whose byte counts add up,
# and a corpus a tiny model trains on reporting a finite val_bpb; byte corpora keep their exact
# files, report val_bpb = val_loss / ln 2, and one without meta.json (older) still trains; a
# meta.json that does not match val.bin is refused.
# Usage: bash tests/cli/data_bpe.sh path/to/meshtrain
set -u

if [[ $# -ne 1 || ! -x $1 ]]; then
    echo "usage: $0 path/to/meshtrain" >&2
    exit 2
fi
MT=$1
WORK=$(mktemp -d /tmp/mt_data_bpe.XXXXXX) || exit 2
trap 'rm -rf -- "$WORK"' EXIT
failed=0
fail() {
    echo "FAIL: $*" >&2
    failed=1
}
TINY=(--layers 1 --width 16 --heads 2 --context 16 --batch 4 --steps 3 --eval_every 3
      --sample_tokens 0)

# Two texts of the same few words, so that BPE finds merges; fixed seed, same every run.
/usr/bin/python3 - "$WORK" <<'PY'
import random, sys
random.seed(7)
words = ("in the beginning god created the heaven and the earth and the earth was without "
         "form and void").split()
for name in ("a.txt", "b.txt"):
    with open(f"{sys.argv[1]}/{name}", "w") as out:
        for _ in range(300):
            out.write(" ".join(random.choice(words) for _ in range(10)) + ".\n")
PY
cat "$WORK/a.txt" "$WORK/b.txt" >"$WORK/ab.txt"
{ cat "$WORK/a.txt"; printf '<|endoftext|>'; cat "$WORK/b.txt"; } >"$WORK/a_eot_b.txt"

timeout 20 "$MT" tokenizer train "$WORK/a.txt" "$WORK/b.txt" --vocab 300 --out "$WORK/tok.json" \
    >/dev/null 2>&1 || fail "tokenizer train"
timeout 20 "$MT" data text "$WORK/a.txt" "$WORK/b.txt" --out "$WORK/bpe" \
    --tokenizer "$WORK/tok.json" >"$WORK/data.log" 2>&1 || fail "data text --tokenizer: $(cat "$WORK/data.log")"

# Header: width 2, vocabulary bound 300 (the tokenizer's); the ids decode back to both texts
# with the end-of-text token between them, which decodes to "<|endoftext|>".
header=($(od -An -tu4 -N32 "$WORK/bpe/train.bin"))
[[ ${header[3]:-} == 2 && ${header[6]:-} == 300 ]] ||
    fail "train.bin header: width ${header[3]:-?}, vocab ${header[6]:-?}"
{ od -An -tu2 -v -j32 "$WORK/bpe/train.bin"; od -An -tu2 -v -j32 "$WORK/bpe/val.bin"; } |
    tr -s ' \n' '  ' >"$WORK/ids.txt"
timeout 20 "$MT" tokenizer decode --tokenizer "$WORK/tok.json" "$WORK/ids.txt" >"$WORK/back.txt" ||
    fail "tokenizer decode"
cmp -s "$WORK/a_eot_b.txt" "$WORK/back.txt" || fail "the token files do not decode back to the texts"
/usr/bin/python3 - "$WORK" <<'PY' || fail "bpe/meta.json"
import json, os, sys
w = sys.argv[1]
meta = json.load(open(w + "/bpe/meta.json"))
assert meta["train_bytes"] + meta["val_bytes"] == os.path.getsize(w + "/ab.txt"), meta
assert meta["val_tokens"] * 2 + 32 == os.path.getsize(w + "/bpe/val.bin"), meta
assert meta["train_tokens"] * 2 + 32 == os.path.getsize(w + "/bpe/train.bin"), meta
assert meta["val_tokens"] < meta["val_bytes"], "BPE tokens hold more than a byte each"
PY

# A vocabulary below the tokenizer's is refused; at least it, the run reports val_bpb.
if timeout 20 "$MT" train --data "$WORK/bpe" --vocab 256 --out "$WORK/small" "${TINY[@]}" \
    >/dev/null 2>&1; then
    fail "train --vocab 256 on a 300-token corpus succeeded"
fi
timeout 20 "$MT" train --data "$WORK/bpe" --vocab 300 --out "$WORK/run_bpe" "${TINY[@]}" \
    >"$WORK/bpe.log" 2>&1 || fail "train on the BPE corpus: $(cat "$WORK/bpe.log")"
grep -q "val bpb" "$WORK/bpe.log" || fail "the progress line has no val bpb"

# Byte tokens: the files are the header and the text's bytes, split as before.
timeout 20 "$MT" data text "$WORK/ab.txt" --out "$WORK/bytes" >/dev/null 2>&1 || fail "data text"
timeout 20 "$MT" train --data "$WORK/bytes" --out "$WORK/run_bytes" "${TINY[@]}" \
    >"$WORK/bytes.log" 2>&1 || fail "train on the byte corpus: $(cat "$WORK/bytes.log")"
cp -r "$WORK/bytes" "$WORK/old" && rm -f "$WORK/old/meta.json"
timeout 20 "$MT" train --data "$WORK/old" --out "$WORK/run_old" "${TINY[@]}" \
    >"$WORK/old.log" 2>&1 || fail "train on a corpus without meta.json: $(cat "$WORK/old.log")"
# A meta.json that does not match val.bin (left from another corpus) is refused, naming it.
cp -r "$WORK/bytes" "$WORK/stale" && cp "$WORK/bpe/meta.json" "$WORK/stale/meta.json"
if timeout 20 "$MT" train --data "$WORK/stale" --out "$WORK/run_stale" "${TINY[@]}" \
    >"$WORK/stale.log" 2>&1; then
    fail "train on a corpus with a stale meta.json succeeded"
fi
grep -q "meta.json" "$WORK/stale.log" || fail "stale meta.json: $(cat "$WORK/stale.log")"

/usr/bin/python3 - "$WORK" <<'PY' || fail "metrics and byte files"
import json, math, struct, sys
w = sys.argv[1]
def last(run):
    return [json.loads(line) for line in open(f"{w}/{run}/metrics.jsonl")][-1]
bpe = last("run_bpe")
assert math.isfinite(bpe["val_bpb"]) and bpe["val_bpb"] > 0, bpe
meta = json.load(open(w + "/bpe/meta.json"))
want = bpe["val_loss"] / math.log(2) * meta["val_tokens"] / meta["val_bytes"]
assert abs(bpe["val_bpb"] - want) < 1e-6 * want, (bpe, want)
summary = json.load(open(w + "/run_bpe/summary.json"))
assert summary["final_val_bpb"] == bpe["val_bpb"], summary
byte = last("run_bytes")
assert abs(byte["val_bpb"] - byte["val_loss"] / math.log(2)) < 1e-6 * byte["val_bpb"], byte
old = last("run_old")
assert "val_loss" in old and "val_bpb" not in old, old
assert json.load(open(w + "/run_old/summary.json"))["final_val_bpb"] is None
text = open(w + "/ab.txt", "rb").read()
val = int(len(text) * 0.1)
for name, part in (("train", text[:-val]), ("val", text[-val:])):
    data = open(f"{w}/bytes/{name}.bin", "rb").read()
    header = b"MTTOKENS" + struct.pack("<IIQII", 1, 1, len(part), 256, 0)
    assert data == header + part, name + ".bin is not the header and the text's bytes"
PY

if ((failed)); then
    exit 1
fi
echo "data_bpe: ok"
