#!/usr/bin/env bash
# ctest cli_layouts_refused: a layout that cannot run is refused by the run plan before any
# worker starts: one line naming the keys, exit status 2, nothing on stdout (no launcher or
# rank lines) and no output folder (no worker ran long enough to make it).
# Usage: bash tests/cli/layouts_refused.sh path/to/meshtrain
set -u

MT=${1:?usage: layouts_refused.sh path/to/meshtrain}
work=$(mktemp -d)
trap 'rm -rf -- "$work"' EXIT
export TMPDIR=$work
tiny=(--layers 2 --heads 2 --width 32 --context 16 --batch 4 --steps 2 --threads 1)
failed=0

# refused NAME KEYS-PHRASE ARGS...: train with ARGS must be refused as above, naming KEYS-PHRASE.
refused() {
  local name=$1 phrase=$2
  shift 2
  local out=$work/out_$name
  timeout 60 "$MT" train "${tiny[@]}" --out "$out" "$@" >"$work/stdout" 2>"$work/stderr"
  local status=$? problem=""
  local lines
  lines=$(wc -l <"$work/stderr")
  if [[ $status -ne 2 ]]; then
    problem="exit status $status, want 2"
  elif [[ $lines -ne 1 ]]; then
    problem="$lines lines on stderr, want the one message"
  elif ! grep -qF -- "meshtrain train: error: $phrase" "$work/stderr"; then
    problem="the message does not name $phrase"
  elif [[ -s $work/stdout ]]; then
    problem="something ran: $(head -n 1 "$work/stdout")"
  elif [[ -e $out ]]; then
    problem="a worker made $out"
  fi
  if [[ -n $problem ]]; then
    echo "FAIL $name: $problem"
    echo "     command: $MT train ${tiny[*]} $*"
    sed 's/^/     stderr: /' "$work/stderr"
    failed=$((failed + 1))
  else
    echo "ok   $name: $(cat "$work/stderr")"
  fi
}

refused batch_split "config keys 'batch', 'microbatches' and 'dp'" --nproc 2 --batch 3
refused mesh_world "config keys 'dp', 'pp' and 'tp' on 3 ranks" --nproc 3 --dp 2
refused tp_world "config keys 'dp', 'pp' and 'tp' on 4 ranks" --nproc 4 --tp 3
refused tp_heads "config keys 'dp', 'pp' and 'tp' on 4 ranks" --nproc 4 --tp 4
refused schedule_fill "config keys 'microbatches' and 'pp'" --nproc 2 --pp 2 --microbatches 1
refused zero3_keep_params "config keys 'zero3_keep_params' and 'zero'" --nproc 2 --zero 2 \
  --zero3_keep_params on
refused shard_divides "config keys 'zero_shard_size' and 'dp'" --nproc 4 --zero 1 \
  --zero_shard_size 3
refused shard_zero0 "config keys 'zero_shard_size' and 'zero'" --nproc 4 --zero_shard_size 2
refused sp_context "config keys 'sp', 'context' and 'tp'" --nproc 2 --tp 2 --sp on --context 15
refused one_process "config keys 'dp', 'pp' and 'tp'" --dp 2
refused heads_width "config keys 'heads' and 'width'" --nproc 2 --width 33
refused deterministic_dp "config keys 'deterministic' and 'dp': dp 3 is not a power of 2" \
  --nproc 3 --batch 6 --deterministic on
refused deterministic_zb1 "config keys 'deterministic' and 'pp', 'schedule': the zb1 schedule" \
  --nproc 2 --pp 2 --microbatches 2 --schedule zb1 --deterministic on

if ((failed)); then
  echo "$failed layout(s) not refused as they should be"
  exit 1
fi
