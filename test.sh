#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds with clang under ASan/UBSan and runs
# the fast tests there, then builds the release (gcc) and runs every test; ctest's line closes.
set -euo pipefail
cd "$(dirname "$0")"
scripts/deps.sh test
jobs=$(nproc)
# Failed jobs keep their flight-recorder dumps in TMPDIR for a human to read, and the tests fail
# jobs on purpose: theirs go to a folder of the run's own.
TMPDIR=$(mktemp -d)
export TMPDIR
trap 'rm -rf "$TMPDIR"' EXIT

echo "== sanitizer build (clang -O2, AddressSanitizer + UndefinedBehaviorSanitizer)"
CC=clang cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=Debug -DMT_SANITIZE=ON > /dev/null
cmake --build build-sanitize -j"$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-sanitize --output-on-failure -L 'unit|cli|train' -E cli_train_learns

echo "== release build (gcc) and the whole suite"
CC=gcc cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure
