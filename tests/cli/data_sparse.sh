#!/usr/bin/env bash
# A corpus larger than memory trains: two sparse 16 GiB shards of token 0 (32 GiB, more than this
# machine's RAM, almost nothing on disk) train a few steps from their memory maps, and `data
# inspect` checks every token without reading the holes; the run's resident memory stays small.
# Usage: bash tests/cli/data_sparse.sh path/to/meshtrain
set -u

if [[ $# -ne 1 || ! -x $1 ]]; then
    echo "usage: $0 path/to/meshtrain" >&2
    exit 2
fi
MT=$1
WORK=$(mktemp -d /tmp/mt_data_sparse.XXXXXX) || exit 2
trap 'rm -rf -- "$WORK"' EXIT
failed=0
fail() {
    echo "FAIL: $*" >&2
    failed=1
}

# shard PATH COUNT_LE: a token file header (2-byte tokens, vocabulary bound 256) for the count
# given as 8 little-endian \x bytes, then a hole to the file's full size
shard() {
    printf 'MTTOKENS\x01\x00\x00\x00\x02\x00\x00\x00'"$2"'\x00\x01\x00\x00\x00\x00\x00\x00' >"$1"
    truncate -s "$3" "$1"
}
mkdir -p "$WORK/big/train" "$WORK/big/val"
shard_tokens=$((1 << 33)) # 16 GiB of 2-byte tokens
bytes=$((32 + 2 * shard_tokens))
shard "$WORK/big/train/000000.bin" '\x00\x00\x00\x00\x02\x00\x00\x00' $bytes
shard "$WORK/big/train/000001.bin" '\x00\x00\x00\x00\x02\x00\x00\x00' $bytes
shard "$WORK/big/val/000000.bin" '\x00\x10\x00\x00\x00\x00\x00\x00' $((32 + 2 * 4096))
index() { # TOKENS BYTES FILES...
    local tokens=$1 each=$2 size=$3
    shift 3
    local list="" sep=""
    for f in "$@"; do
        list+="$sep{\"file\": \"$f\", \"tokens\": $each, \"bytes\": $size, \"eot_tokens\": 0}"
        sep=", "
    done
    echo "{\"version\": 1, \"token_bytes\": 2, \"vocab\": 256, \"tokens\": $tokens, \"eot\": -1, \"shards\": [$list]}"
}
index $((2 * shard_tokens)) $shard_tokens $bytes 000000.bin 000001.bin >"$WORK/big/train/index.json"
index 4096 4096 $((32 + 2 * 4096)) 000000.bin >"$WORK/big/val/index.json"

ram=$(($(awk '/^MemTotal/ {print $2}' /proc/meminfo) * 1024))
logical=$((2 * bytes))
((logical > ram)) || fail "the corpus ($logical bytes) is not larger than memory ($ram bytes)"
on_disk=$(du -sk "$WORK/big" | cut -f1)
if ((on_disk > 1024)); then
    echo "data_sparse: skipped: this file system stores the holes ($on_disk KiB)" >&2
    exit 77
fi

timeout 120 "$MT" data inspect "$WORK/big" --excerpt 4 >"$WORK/inspect.out" 2>&1 ||
    fail "data inspect: $(cat "$WORK/inspect.out")"
grep -q "^train: $((2 * shard_tokens)) tokens in 2 shards" "$WORK/inspect.out" ||
    fail "inspect: $(cat "$WORK/inspect.out")"

timeout 120 "$MT" train --data "$WORK/big" --out "$WORK/run" --vocab 256 --layers 1 --heads 2 \
    --width 16 --context 64 --batch 8 --microbatches 2 --steps 4 --warmup 1 --eval_every 4 \
    --eval_seqs 8 --sample_tokens 0 --threads 1 >"$WORK/train.log" 2>&1 ||
    fail "train: $(tail -3 "$WORK/train.log")"
/usr/bin/python3 - "$WORK/run" <<'PY' || fail "the run's figures"
import json, math, sys
steps = [json.loads(line) for line in open(f"{sys.argv[1]}/metrics.jsonl")]
assert [s["step"] for s in steps] == [1, 2, 3, 4], steps
assert all(math.isfinite(s["loss"]) for s in steps) and math.isfinite(steps[-1]["val_loss"])
summary = json.load(open(f"{sys.argv[1]}/summary.json"))
peak = summary["memory"][0]["resident_peak"]
assert peak < 1 << 30, f"resident peak {peak} bytes: the corpus was read into memory"
files = {d["path"]: d for d in summary["provenance"]["data_files"]}
big = files["train/000000.bin"]
assert "xxh3_sampled" in big and "xxh3" not in big, big  # 16 GiB: sampled, not read whole
assert files["val/000000.bin"]["xxh3"] is not None, files
PY

[[ $failed == 0 ]] && echo "data_sparse: ok"
exit $failed
