#!/usr/bin/env bash
# Data-, tensor- and pipeline-parallel runs fail loudly: a NaN loss or gradient on one rank
# stops every rank naming the step and the rank; a replica (or a tied-embedding copy) whose
# parameters drift is named by the checksum; layouts the batch, the model or the build cannot
# take are refused before training.
# usage: dp_safety.sh MESHTRAIN
set -uo pipefail
meshtrain=$1
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
export TMPDIR="$scratch" # the flight-recorder folders that the failed jobs keep
bible -f gen1:1-gen3:24 > "$scratch/text.txt"
"$meshtrain" data text "$scratch/text.txt" --out "$scratch/data" > /dev/null || exit 1
job=(--data "$scratch/data" --vocab 256 --context 16 --layers 2 --heads 2 --width 32 --batch 12
     --steps 8 --warmup 2 --eval_every 0 --sample_tokens 0 --threads 1 --out "$scratch/run")

failed=0
# expect NAME FAULT PHRASE RANKS -- ARGS: the run must exit 1 within 60 s, and PHRASE must be
# in the error lines of each of the world ranks RANKS (the launcher prefixes lines "[r] "), or
# with RANKS "-" exit 2 with PHRASE in the output of the command itself (the run plan refused
# the layout before any rank started).
expect() {
  local name=$1 fault=$2 phrase=$3 ranks=$4
  shift 5
  MT_INJECT_FAULT=$fault timeout 60 "$meshtrain" train "${job[@]}" "$@" > "$scratch/out" 2>&1
  local status=$? problem="" want=1
  [ "$ranks" != - ] || want=2
  [ $status -eq $want ] || problem="exit status $status, want $want"
  ! grep -qE 'Sanitizer|runtime error:' "$scratch/out" || problem="$problem; a sanitizer report"
  [ "$ranks" != - ] || grep -qF "$phrase" "$scratch/out" || problem="$problem; no '$phrase'"
  [ "$ranks" != - ] || ranks=""
  report "$name" "$problem$(missing "$phrase" "$ranks")"
}

# also NAME PHRASE RANKS: the previous run's output must also hold PHRASE for RANKS.
also() {
  report "$1" "$(missing "$2" "$3")"
}

# missing PHRASE RANKS: "; rank r does not say ..." for each of RANKS whose lines lack PHRASE.
missing() {
  for r in $2; do
    grep -F "[$r] " "$scratch/out" | grep -qF "$1" || printf "; rank %s does not say '%s'" "$r" "$1"
  done
}

report() {
  if [ -n "$2" ]; then
    echo "FAIL $1: $2"; cat "$scratch/out"; failed=1
  else
    echo "ok   $1"
  fi
}

expect "NaN loss on rank 1 of 2 (DDP)" nan_loss@1:3 \
  "step 3: the loss is NaN on rank 1 (data-parallel 1, tensor-parallel 0);" "0 1" -- --nproc 2 --zero 0
expect "NaN gradient on rank 2 of 3 (ZeRO-2)" nan_grad@2:4 \
  "step 4: the gradient is NaN on rank 2 (data-parallel 2, tensor-parallel 0);" "0 1 2" -- --nproc 3 --zero 2
expect "NaN gradient on rank 0 of 4 (ZeRO-3, accumulation)" nan_grad@0:2 \
  "step 2: the gradient is NaN on rank 0 (data-parallel 0, tensor-parallel 0);" "0 1 2 3" -- --nproc 4 --zero 3 --microbatches 3
expect "drifted replica 1 of 3 (DDP)" skew@1:4 \
  "step 4: the parameters of data-parallel replica 1 differ from the other 2 replicas'" "0 1 2" \
  -- --nproc 3 --zero 0 --check_every 2
expect "drifted replica 1 of 2 (ZeRO-1)" skew@1:6 \
  "step 6: the parameters of data-parallel replica 1 differ" "0 1" -- --nproc 2 --zero 1 --check_every 3
expect "batch that dp x microbatches does not divide" "" \
  "a global batch of 12 sequences does not split into 4 data-parallel ranks x 2 micro-batches" - \
  -- --nproc 4 --microbatches 2
expect "NaN gradient on tensor-parallel rank 1 of dp 2 x tp 2" nan_grad@3:3 \
  "step 3: the gradient is NaN on ranks 2 (data-parallel 1, tensor-parallel 0), 3 (data-parallel 1, tensor-parallel 1)" "0 1 2 3" \
  -- --nproc 4 --tp 2 --zero 1
expect "drifted tensor-parallel shard (dp 2 x tp 2)" skew@3:4 \
  "step 4: the parameters of data-parallel replica 1 differ" "1 3" -- --nproc 4 --tp 2 --check_every 2
also "ranks that compared other shards stop too" "step 4: the replica check failed on ranks 1, 3" "0 2"
expect "drifted replicated norm on tensor-parallel rank 1 (tp 2)" skew_norm@1:4 \
  "step 4: the replicated tensors (norms, positions, output biases) of tensor-parallel rank 1 differ" \
  "0 1" -- --nproc 2 --tp 2 --check_every 2
expect "tp that does not divide the heads" "" "tp 3 does not divide the 2 attention heads" - \
  -- --nproc 3 --tp 3
expect "sequence parallelism with a context tp does not divide" "" \
  "sequence parallelism splits the sequence into tp 2 parts, which context 15 does not divide" - \
  -- --nproc 2 --tp 2 --sp on --context 15
# Pipelines: a NaN loss scale on the last stage reaches stage 0 through the gradients it sends;
# a drifted copy of the tied embeddings is caught; layouts a pipeline cannot take are refused.
expect "NaN gradient on the last of 2 pipeline stages" nan_grad@1:3 \
  "step 3: the gradient is NaN on ranks 0 (data-parallel 0, stage 0, tensor-parallel 0), 1 (data-parallel 0, stage 1, tensor-parallel 0)" \
  "0 1" -- --nproc 2 --pp 2 --microbatches 2
expect "drifted tied-embedding copy on the last stage" skew@1:4 \
  "step 4: the last pipeline stage's copy of the tied embeddings differs from the first stage's" \
  "0 1" -- --nproc 2 --pp 2 --microbatches 2 --check_every 2
expect "fewer micro-batches than stages" "" "1 micro-batches cannot fill 2 pipeline stages" - \
  -- --nproc 2 --pp 2
expect "more model chunks than layers" "" "2 layers cannot be cut into pp 2 x chunks 2" - \
  -- --nproc 2 --pp 2 --microbatches 2 --schedule interleaved --chunks 2
expect "chunks without the interleaved schedule" "" "need the interleaved schedule, not 1f1b" \
  - -- --nproc 2 --pp 2 --microbatches 2 --chunks 2
expect "a malformed fault request" "nan@x" "MT_INJECT_FAULT 'nan@x'" "0 1" -- --nproc 2

# One process: the key is checked before anything runs, and a skewed replica cannot exist.
if timeout 30 "$meshtrain" train "${job[@]}" --zero 4 > "$scratch/out" 2>&1 ||
   ! grep -q "zero" "$scratch/out"; then
  echo "FAIL zero 4 is not refused"; cat "$scratch/out"; failed=1
else
  echo "ok   zero 4 refused"
fi
exit $failed
