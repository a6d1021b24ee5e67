#!/usr/bin/env bash
# Trains a small GPT on the KJV corpus and checks that it learns (validation loss falls by a
# fixed margin in 300 steps), that metrics.jsonl is well formed, and that the main config parses.
set -euo pipefail
meshtrain=$1
project=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

timeout 60 "$meshtrain" data kjv --out "$work/kjv"
timeout 240 "$meshtrain" train --data "$work/kjv" --out "$work/run" \
  --layers 2 --heads 4 --width 64 --context 64 --batch 16 --microbatches 2 \
  --steps 300 --warmup 20 --lr 3e-3 --eval_every 100 --eval_seqs 32 --sample_tokens 40 \
  --log_every 100 | tee "$work/out.txt"

/usr/bin/python3 - "$work/run" "$work/out.txt" <<'PY'
import json, math, sys
run, out = sys.argv[1], open(sys.argv[2]).read()
rows = [json.loads(line) for line in open(run + "/metrics.jsonl")]
assert [r["step"] for r in rows] == list(range(1, 301)), "one metrics line per step, from 1"
for r in rows:
    for key in ("loss", "lr", "grad_norm", "tokens_per_s"):
        assert math.isfinite(r[key]), (key, r)
evaluated = [r for r in rows if "val_loss" in r]
assert [r["step"] for r in evaluated] == [100, 200, 300], evaluated
first, last = rows[0]["loss"], evaluated[-1]["val_loss"]
print(f"first loss {first:.4f}, final validation loss {last:.4f}")
assert first > 5.0, "an untrained byte model starts near ln(256) = 5.55"
assert last < first - 2.5, "validation loss must fall by at least 2.5 nats in 300 steps"
assert evaluated[0]["val_loss"] > evaluated[-1]["val_loss"], "validation loss keeps falling"
summary = json.load(open(run + "/summary.json"))
assert summary["steps"] == 300 and summary["tokens_per_s"] > 0
assert "--- sample" in out and "And God said" in out, "a sample is printed at the end"
print("train_learns: metrics, summary and sample ok")
PY

# The main job's configuration parses and runs (two steps, so the test stays short).
timeout 120 "$meshtrain" train --config "$project/configs/default.ini" --data "$work/kjv" \
  --out "$work/default" --steps 2 --eval_every 0 --sample_tokens 0 > /dev/null
echo "train_learns: 3 passed, 0 failed"
