#!/usr/bin/env bash
# Pipelined validation: the validation batches flow through the stages one behind the other,
# and every evaluation's loss equals one process's within 1e-6 relative on pp 2 (1F1B and zb1),
# pp 2 with 2 chunks per stage, and dp 2 x pp 2 (each replica its share of the windows).
# usage: pp_eval.sh MESHTRAIN
set -euo pipefail
meshtrain=$1
source "$(dirname "$0")/genesis_setup.sh"

# micro-batches of 2 sequences: 24 windows are 12 validation batches on one replica
job=(--data "$scratch/data" --context 16 --batch 8 --microbatches 4 --steps 4 --warmup 1
     --lr 1e-3 --vocab 256 --heads 4 --width 64 --layers 4 --eval_every 2 --eval_seqs 24
     --sample_tokens 0 --threads 1 --save_model off)
"$meshtrain" train "${job[@]}" --out "$scratch/one" > "$scratch/one.log" 2>&1 ||
  { cat "$scratch/one.log"; exit 1; }
failed=0
layout() {
  local name=$1
  shift
  if ! timeout 240 "$meshtrain" train "${job[@]}" "$@" --out "$scratch/$name" \
      > "$scratch/$name.log" 2>&1; then
    echo "FAIL $name: the run failed"; cat "$scratch/$name.log"; failed=1; return
  fi
  python3 - "$scratch/one/metrics.jsonl" "$scratch/$name/metrics.jsonl" "$name" <<'PY' || failed=1
import json, sys
def val(path):
    return [(r["step"], r["val_loss"]) for r in map(json.loads, open(path)) if "val_loss" in r]
want, got, name = val(sys.argv[1]), val(sys.argv[2]), sys.argv[3]
if len(want) != 2 or [s for s, _ in want] != [s for s, _ in got]:
    sys.exit(f"FAIL {name}: evaluations at steps {[s for s, _ in got]}, want {[s for s, _ in want]}")
for (step, w), (_, g) in zip(want, got):
    if abs(g - w) > 1e-6 * abs(w):
        sys.exit(f"FAIL {name}: step {step} validation loss {g!r}, one process {w!r}")
print(f"ok {name}: validation losses {[g for _, g in got]} (one process {[w for _, w in want]})")
PY
}
layout pp2 --nproc 2 --pp 2
layout pp2_zb1 --nproc 2 --pp 2 --schedule zb1
layout pp2_interleaved --nproc 2 --pp 2 --schedule interleaved --chunks 2
layout dp2_pp2 --nproc 4 --pp 2
exit $failed
