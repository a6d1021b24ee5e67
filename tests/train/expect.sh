# Sourced by the checkpoint and interchange tests (after genesis_setup.sh): recording failures,
# commands that must fail with a given message, and runs of the caller's job into a folder.
failed=0
fail() { echo "FAIL $*"; failed=1; }

# must_fail PATTERN COMMAND...: COMMAND fails, its output matches PATTERN (an extended regex),
# and no sanitizer reported anything.
must_fail() {
  local pattern=$1 log="$scratch/fail.log"; shift
  if "$@" >"$log" 2>&1; then fail "succeeded: $*"; return 0; fi
  grep -Eq -e "$pattern" "$log" || { fail "no '$pattern' in the output of: $*"; cat "$log"; }
  grep -q "AddressSanitizer\|runtime error" "$log" && { fail "sanitizer report: $*"; cat "$log"; }
  return 0
}

# train_into OUT ARGS...: meshtrain train with the caller's ${job[@]} and ARGS into OUT (its
# output in OUT.log, shown on failure), bounded in time.
train_into() {
  local out=$1; shift
  timeout 240 "$meshtrain" train "${job[@]}" --out "$out" "$@" > "$out.log" 2>&1 ||
    { fail "the run into $out failed"; tail -n 20 "$out.log"; return 1; }
}

# metric_column OUT F: field F of every step line of OUT/metrics.jsonl, space-separated.
metric_column() { grep -v '"event"' "$1/metrics.jsonl" | grep -o "\"$2\": [^,}]*" | cut -d' ' -f2 | tr '\n' ' '; }

# resumes_same RUN STEP ARGS...: RUN's checkpoint of STEP, resumed into RUN_STEP with the job's
# and RUN's own ARGS, ends with RUN's steps (compare_steps.py) and model, bit for bit.
resumes_same() {
  local run=$1 step=$2
  shift 2
  local resumed="${run}_$step"
  mkdir -p "$resumed/ckpt"
  cp -r "$run/ckpt/step_$step" "$resumed/ckpt/"
  train_into "$resumed" "$@" --resume auto &&
    python3 "$here/compare_steps.py" "$run" "$resumed" || failed=1
  cmp -s "$run/model.safetensors" "$resumed/model.safetensors" ||
    fail "resumed from step $step of $run: another model"
}
