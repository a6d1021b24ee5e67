#!/usr/bin/env bash
# --offload_delay against check_delay.py's numpy reference of ZeRO-Offload's delayed update, for
# the held update applied in line (in memory) and on its thread over the offload file.
set -euo pipefail
dump_program=$1
checker=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "== in memory"
timeout 60 "$dump_program" "$work/memory.bin"
timeout 60 /usr/bin/python3 "$checker" "$work/memory.bin"
echo "== offloaded, the held update on its thread"
timeout 60 "$dump_program" "$work/offload.bin" "$work/offload.state"
timeout 60 /usr/bin/python3 "$checker" "$work/offload.bin"
