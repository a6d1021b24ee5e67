#!/usr/bin/env bash
# Usage: scripts/fuzz.sh [seconds]. Fuzzes the tcp frame parser and the receivers' header checks
# (tests/fuzz/fuzz_tcp_frame.c) with libFuzzer, one job at nice 10, default 300 s; fails on a crash.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-300}
if ! [[ $seconds =~ ^[0-9]+$ ]] || [ "$seconds" -eq 0 ]; then
  echo "usage: scripts/fuzz.sh [seconds]   (a whole number of seconds, default 300)" >&2
  exit 2
fi
for p in clang libclang-rt-14-dev; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    echo "fuzzing needs clang and libFuzzer (libclang-rt-14-dev): run scripts/deps.sh test" >&2
    exit 1
  fi
done

build=build-fuzz
work=$build/fuzz/tcp_frame
echo "== building $build (clang, libFuzzer + ASan + UBSan)"
CC=clang cmake -S . -B "$build" -DMT_FUZZ=ON -DMT_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug > /dev/null
nice -n 10 cmake --build "$build" --target fuzz_tcp_frame fuzz_tcp_frame_replay -j"$(nproc)" \
  > /dev/null

# Fresh seeds from the generator; the checked-in corpus is read too; what the fuzzer finds goes
# to $work/corpus (kept between runs), crashes to $work/artifacts.
rm -rf "$work/seeds" "$work/artifacts"
mkdir -p "$work/corpus" "$work/artifacts"
"$build/tests/fuzz_tcp_frame_replay" --write-seeds "$work/seeds" "$work/seeds" \
  tests/fuzz/corpus/tcp_frame

log=$work/fuzz.log
echo "== fuzzing for $seconds s (one job, nice 10; log: $log)"
status=0
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  nice -n 10 "$build/tests/fuzz_tcp_frame" -max_total_time="$seconds" -timeout=10 \
  -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$work/artifacts/" \
  "$work/corpus" "$work/seeds" tests/fuzz/corpus/tcp_frame > "$log" 2>&1 || status=$?

# The last progress line carries the coverage (cov: edges, ft: features, corp: corpus size).
grep -E '^#[0-9]+' "$log" | tail -n 1 || true
grep -E '^stat::' "$log" || true
crashes=$(find "$work/artifacts" -type f | wc -l)
if [ "$status" -ne 0 ] || [ "$crashes" -ne 0 ]; then
  echo "== FAILED (fuzzer status $status, $crashes artifact(s) in $work/artifacts):" >&2
  grep -v '^#[0-9]' "$log" | tail -n 60 >&2
  echo "replay one with: $build/tests/fuzz_tcp_frame_replay <artifact>" >&2
  exit 1
fi
echo "== no crash in $seconds s"
