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
