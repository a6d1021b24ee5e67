#!/usr/bin/env bash
# ctest layer_includes: the real tree keeps the include rules, and a copy broken in each of the
# three ways check_includes.sh knows is refused, naming the file and the rule.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
src=${1:?usage: includes.sh SRC_DIR}
"$here/check_includes.sh" "$src"

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# broken CASE FILE LINE EXPECTED: a copy of src with LINE added to FILE must fail naming EXPECTED.
broken() {
  local case=$1 file=$2 line=$3 expected=$4
  rm -rf "$scratch/src"
  cp -r "$src" "$scratch/src"
  printf '%s\n' "$line" >>"$scratch/src/$file"
  if out=$("$here/check_includes.sh" "$scratch/src" 2>&1); then
    echo "FAIL $case: check_includes accepted $file with: $line" >&2
    exit 1
  fi
  if [[ $out != *"$expected"* ]]; then
    echo "FAIL $case: expected \"$expected\" in: $out" >&2
    exit 1
  fi
  echo "ok $case: $(head -n 1 <<<"$out")"
}

broken upward core/status.c '#include "meshtrain/train.h"' "which core may not use"
broken sideways launch/output.c '#include "meshtrain/model.h"' "which launch may not use"
broken dotdot launch/output.c '#include "../comm/comm_internal.h"' 'a ".." path'
broken private train/lr.c '#include "comm/comm_internal.h"' "not a private header of layer train"
