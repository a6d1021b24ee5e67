#!/usr/bin/env bash
# ctest cli_ps_refused: parameter-server settings that cannot run are refused before any worker
# starts (under --nproc, the run plan on the whole world): one line naming the keys, exit
# status 2, no output folder.
# Usage: bash tests/cli/ps_refused.sh path/to/meshtrain
set -u

MT=${1:?usage: ps_refused.sh path/to/meshtrain}
work=$(mktemp -d)
trap 'rm -rf -- "$work"' EXIT
export TMPDIR=$work
tiny=(--layers 2 --heads 2 --width 32 --context 16 --batch 4 --steps 2 --threads 1)
failed=0

# refused NAME PHRASE ARGS...: train with ARGS exits 2 with one line naming PHRASE.
refused() {
  local name=$1 phrase=$2
  shift 2
  local out=$work/out_$name
  timeout 60 "$MT" train "${tiny[@]}" --out "$out" "$@" >"$work/stdout" 2>"$work/stderr"
  local status=$? problem=""
  if [[ $status -ne 2 ]]; then
    problem="exit status $status, want 2"
  elif [[ $(wc -l <"$work/stderr") -ne 1 ]]; then
    problem="not one line on stderr"
  elif ! grep -qF -- "$phrase" "$work/stderr"; then
    problem="the message does not say: $phrase"
  elif [[ -e $out ]]; then
    problem="an output folder was made"
  fi
  if [[ -n $problem ]]; then
    echo "FAIL $name: $problem"
    cat "$work/stderr"
    failed=1
  fi
}

refused as_many_as_world "'ps_servers' and 'nproc': 2 parameter servers leave no worker in a world of 2" \
  --nproc 2 --ps_servers 2
refused more_than_world "3 parameter servers leave no worker in a world of 2" --nproc 2 --ps_servers 3
refused alone "1 parameter server leaves no worker" --ps_servers 1
refused staleness_without_ssp "'staleness' and 'ps_mode': staleness 2 bounds ssp's clocks, and ps_mode is sync" \
  --nproc 3 --ps_servers 1 --staleness 2
refused staleness_async "ps_mode is async" --nproc 3 --ps_servers 1 --ps_mode async --staleness 1
refused zero "'ps_servers' and 'zero'" --nproc 3 --ps_servers 1 --zero 1
refused zero3 "ZeRO 3 would shard" --nproc 3 --ps_servers 1 --zero 3
refused pipeline "'ps_servers' and 'pp': pipeline-parallel workers are not supported" \
  --nproc 3 --ps_servers 1 --pp 2
refused mode "'ps_mode': 'lazy' is not sync, ssp or async" --nproc 3 --ps_servers 1 --ps_mode lazy
refused mode_without_servers "'ps_mode' and 'ps_servers'" --nproc 2 --ps_mode async
refused ssp_tp "'ps_mode' and 'tp': under ps_mode ssp each worker trains alone" \
  --nproc 5 --ps_servers 1 --ps_mode ssp --tp 2
refused async_uneven_batch "a batch of 4 over 3 workers" --nproc 4 --ps_servers 1 --ps_mode async
refused ssp_checkpoints "checkpoints of ps_mode ssp" --nproc 3 --ps_servers 1 --ps_mode ssp \
  --save_every 1
refused dp_mismatch "config keys 'dp', 'pp' and 'tp' on 2 ranks" --nproc 4 --ps_servers 2 --dp 4
exit $failed
