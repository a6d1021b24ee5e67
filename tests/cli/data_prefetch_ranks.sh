#!/usr/bin/env bash
# Prefetch on several ranks: on a sharded corpus, 2 data-parallel ranks and 2 pipeline stages
# (where the first stage reads tokens and the last targets) train bitwise the same with the
# prefetch thread and without; a bad token met on one rank stops the job with its message, no hang.
# Usage: bash tests/cli/data_prefetch_ranks.sh path/to/meshtrain
set -u

if [[ $# -ne 1 || ! -x $1 ]]; then
    echo "usage: $0 path/to/meshtrain" >&2
    exit 2
fi
MT=$1
untimed="$(cd "$(dirname "$0")/../../scripts" && pwd)/untimed_metrics.sh"
WORK=$(mktemp -d /tmp/mt_data_prefetch.XXXXXX) || exit 2
trap 'rm -rf -- "$WORK"' EXIT
failed=0
fail() {
    echo "FAIL: $*" >&2
    failed=1
}
TINY=(--vocab 256 --layers 2 --width 16 --heads 2 --context 16 --batch 8 --microbatches 4
      --steps 5 --warmup 1 --eval_every 5 --eval_seqs 8 --sample_tokens 0 --threads 1
      --log_every 100 --nproc 2)

/usr/bin/python3 -c 'import random; random.seed(3); print("".join(random.choice("abcdefgh ") for _ in range(20000)))' >"$WORK/text.txt"
timeout 20 "$MT" data text "$WORK/text.txt" --out "$WORK/corpus" --shard_tokens 3000 >/dev/null ||
    fail "data text --shard_tokens"

same_training() {
    cmp -s "$1/model.safetensors" "$2/model.safetensors" &&
        cmp -s <("$untimed" "$1/metrics.jsonl") <("$untimed" "$2/metrics.jsonl")
}
for layout in "--dp 2" "--pp 2"; do
    name=${layout// /}
    for prefetch in 0 3; do
        timeout 120 "$MT" train "${TINY[@]}" $layout --data "$WORK/corpus" --prefetch $prefetch \
            --out "$WORK/$name.$prefetch" >"$WORK/$name.$prefetch.log" 2>&1 ||
            fail "train $layout --prefetch $prefetch: $(tail -3 "$WORK/$name.$prefetch.log")"
    done
    same_training "$WORK/$name.0" "$WORK/$name.3" || fail "$layout: prefetch on and off trained differently"
done

# every token of the second training shard beyond the vocabulary: some step of some rank meets it
/usr/bin/python3 - "$WORK/corpus/train/000001.bin" <<'PY'
import sys
path = sys.argv[1]
data = bytearray(open(path, "rb").read())
data[32:] = b"\xff" * (len(data) - 32)
open(path, "wb").write(data)
PY
sed -i 's/"vocab": 256/"vocab": 200/' "$WORK/corpus/train/index.json"
/usr/bin/python3 - "$WORK/corpus/train" <<'PY'
import glob, struct, sys
for path in glob.glob(f"{sys.argv[1]}/*.bin"):  # the headers' bound to 200, as the index's
    data = bytearray(open(path, "rb").read())
    data[24:28] = struct.pack("<I", 200)
    open(path, "wb").write(data)
PY
TMPDIR=$WORK timeout 120 "$MT" train "${TINY[@]}" --steps 40 --dp 2 --data "$WORK/corpus" --out "$WORK/bad" \
    >"$WORK/bad.log" 2>&1
status=$?
if [[ $status == 0 || $status == 124 ]]; then
    fail "a bad token: exit status $status (want a failure, not success or a hang)"
elif ! grep -q "000001.bin': token 255 at index [0-9]* is not below the vocabulary bound 200" "$WORK/bad.log"; then
    fail "a bad token: no message naming it: $(tail -5 "$WORK/bad.log")"
fi

[[ $failed == 0 ]] && echo "data_prefetch_ranks: ok"
exit $failed
