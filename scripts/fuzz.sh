#!/usr/bin/env bash
# Usage: scripts/fuzz.sh [seconds] [tcp_frame|store_frame|ckpt_meta|ckpt_shard|safetensors|tokenizer|all].
# Fuzzes tests/fuzz/fuzz_<target>.c with libFuzzer, one job at nice 10, default 300 s per target,
# every target one after another by default; fails on a crash.
set -euo pipefail
cd "$(dirname "$0")/.."
usage() {
  echo "usage: scripts/fuzz.sh [seconds]" \
    "[tcp_frame|store_frame|ckpt_meta|ckpt_shard|safetensors|tokenizer|all]" >&2
  echo "  seconds: a whole number per target (default 300); the target defaults to all" >&2
  exit 2
}
seconds=${1:-300}
which=${2:-all}
if ! [[ $seconds =~ ^[0-9]+$ ]] || [ "$seconds" -eq 0 ]; then
  usage
fi
case $which in
  tcp_frame | store_frame | ckpt_meta | ckpt_shard | safetensors | tokenizer) targets=$which ;;
  all) targets="tcp_frame store_frame ckpt_meta ckpt_shard safetensors tokenizer" ;;
  *) usage ;;
esac
for p in clang libclang-rt-14-dev; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    echo "fuzzing needs clang and libFuzzer (libclang-rt-14-dev): run scripts/deps.sh test" >&2
    exit 1
  fi
done

build="build-fuzz"
builds=()
for t in $targets; do
  builds+=("fuzz_$t" "fuzz_${t}_replay")
done
echo "== building $build (clang, libFuzzer + ASan + UBSan)"
CC=clang cmake -S . -B "$build" -DMT_FUZZ=ON -DMT_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug > /dev/null
nice -n 10 cmake --build "$build" --target "${builds[@]}" -j"$(nproc)" > /dev/null

# One target: fresh seeds from the generator; the checked-in corpus is read too; what the fuzzer
# finds goes to $work/corpus (kept between runs), crashes to $work/artifacts.
fuzz_one() {
  local t=$1 work=$build/fuzz/$1
  rm -rf "$work/seeds" "$work/artifacts"
  mkdir -p "$work/corpus" "$work/artifacts" || return 1
  # (Called under ||, where set -e is off: each failure is caught by hand.)
  if ! "$build/tests/fuzz_${t}_replay" --write-seeds "$work/seeds" "$work/seeds" \
    "tests/fuzz/corpus/$t"; then
    echo "== $t FAILED: the seeds or the checked-in corpus break a property" >&2
    return 1
  fi

  local log=$work/fuzz.log status=0
  echo "== fuzzing $t for $seconds s (one job, nice 10; log: $log)"
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    nice -n 10 "$build/tests/fuzz_$t" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$work/artifacts/" \
    "$work/corpus" "$work/seeds" "tests/fuzz/corpus/$t" > "$log" 2>&1 || status=$?

  # The last progress line carries the coverage (cov: edges, ft: features, corp: corpus size).
  grep -E '^#[0-9]+' "$log" | tail -n 1 || true
  grep -E '^stat::' "$log" || true
  local crashes
  crashes=$(find "$work/artifacts" -type f | wc -l)
  if [ "$status" -ne 0 ] || [ "$crashes" -ne 0 ]; then
    echo "== $t FAILED (fuzzer status $status, $crashes artifact(s) in $work/artifacts):" >&2
    grep -v '^#[0-9]' "$log" | tail -n 60 >&2
    echo "replay one with: $build/tests/fuzz_${t}_replay <artifact>" >&2
    return 1
  fi
  echo "== $t: no crash in $seconds s"
}

failed=0
for t in $targets; do
  fuzz_one "$t" || failed=1
done
exit "$failed"
