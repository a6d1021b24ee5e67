#!/usr/bin/env bash
# ctest layer_compile: the build itself refuses an include that points up or sideways. One file
# of a lower layer is compiled with the exact command of the build (compile_commands.json), as
# it is and with such an include added: the first must compile, the second must not.
set -euo pipefail

build=${1:?usage: upward_include.sh BUILD_DIR SRC_DIR}
src=${2:?usage: upward_include.sh BUILD_DIR SRC_DIR}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# compile FILE COPY: FILE's command from the build, run on COPY (its object goes to scratch).
compile() {
  /usr/bin/env python3 - "$build/compile_commands.json" "$(realpath "$1")" "$2" "$scratch/out.o" <<'PY'
import json, shlex, subprocess, sys
commands, source, copy, obj = sys.argv[1:]
entry = next((e for e in json.load(open(commands)) if e["file"] == source), None)
if entry is None:
    sys.exit(f"upward_include: {source} is not in {commands}")
args = entry.get("arguments") or shlex.split(entry["command"])
args = [copy if a == source else a for a in args]
args[args.index("-o") + 1] = obj
sys.exit(subprocess.run(args, cwd=entry["directory"]).returncode)
PY
}

# case NAME FILE HEADER: FILE compiles as it is, and fails with HEADER included.
case_() {
  local name=$1 file=$src/$2 header=$3
  local copy=$scratch/$(basename "$file")
  cp "$file" "$copy"
  if ! compile "$file" "$copy" 2>"$scratch/err"; then
    cat "$scratch/err" >&2
    echo "FAIL $name: $2 does not compile even as it is" >&2
    exit 1
  fi
  # The copy sits outside its folder, so its own private headers come from the layer's
  # include path: a fair test of what the target's flags allow.
  printf '#include "%s"\n' "$header" >>"$copy"
  if compile "$file" "$copy" 2>"$scratch/err"; then
    echo "FAIL $name: $2 compiled with #include \"$header\"" >&2
    exit 1
  fi
  if ! grep -q "$header" "$scratch/err"; then
    cat "$scratch/err" >&2
    echo "FAIL $name: the compiler failed, but not on $header" >&2
    exit 1
  fi
  echo "ok $name: $2 with #include \"$header\": $(grep -m 1 "$header" "$scratch/err")"
}

case_ upward core/status.c meshtrain/train.h
case_ sideways launch/output.c meshtrain/model.h
case_ private_of_another train/lr.c comm_internal.h
