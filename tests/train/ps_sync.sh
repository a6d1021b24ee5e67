#!/usr/bin/env bash
# ctest train_ps_sync: synchronous parameter servers train DDP's model bit for bit. A 20-step
# job on 2 workers with 1 and with 2 servers, and on 2 workers of tp 2 with 2 servers, against
# DDP (dp 2, and dp 2 x tp 2) on the same ranks' data: every step's loss and gradient norm and
# every final parameter equal, exactly.
# usage: ps_sync.sh MESHTRAIN
set -euo pipefail
meshtrain=$1
source "$(dirname "$0")/genesis_setup.sh"
source "$(dirname "$0")/ps_lib.sh"
ps_job+=(--check_every 5)

# same NAME REFERENCE: bit for bit.
same() {
  (cd "$scratch" && python3 "$here/compare_runs.py" "$2" "$1" 0) || { echo "FAIL $1 differs from $2"; failed=1; }
}

run ddp2 --nproc 2 && run ps_1server --nproc 3 --ps_servers 1 && same ps_1server ddp2
run ps_2servers --nproc 4 --ps_servers 2 && same ps_2servers ddp2
run ddp2_tp2 --nproc 4 --tp 2 && run ps_tp2 --nproc 6 --tp 2 --ps_servers 2 && same ps_tp2 ddp2_tp2
exit $failed
