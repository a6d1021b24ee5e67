#!/usr/bin/env bash
# ctest train_ps_ssp: the parameter servers' ssp and async modes. ssp with staleness 0 trains
# sync's model bit for bit (1 and 2 servers); ssp with staleness 2 and a worker slowed keeps its
# bound in the servers' log (and the check refuses the same log against bound 1); ssp and async
# end within 10% of sync's validation loss; a worker killed mid-run under async and under ssp is
# dropped, the job goes on, and its restarted life rejoins and pushes again.
# usage: ps_ssp.sh MESHTRAIN
set -euo pipefail
meshtrain=$1
source "$(dirname "$0")/genesis_setup.sh"
export MT_COMM_TIMEOUT=20
source "$(dirname "$0")/ps_lib.sh"
PS_RUN_SECONDS=60

# same NAME REFERENCE: bit for bit (norms and final parameters; a worker's loss is its own).
same() {
  (cd "$scratch" && python3 "$here/compare_runs.py" "$2" "$1" 0 grad_norm) || { echo "FAIL $1 differs from $2"; failed=1; }
}
# near NAME REFERENCE: the last validation loss at most 10% above the reference's (20 steps of
# a tiny model; the issue's 3% at equal tokens is bench/ps_vs_allreduce's longer run).
near() {
  python3 - "$scratch/$2/metrics.jsonl" "$scratch/$1/metrics.jsonl" "$1" <<'PY' || failed=1
import json, sys
def last(p):
    return [json.loads(l)["val_loss"] for l in open(p) if "val_loss" in json.loads(l)][-1]
ref, run = last(sys.argv[1]), last(sys.argv[2])
ok = run <= ref * 1.10
print(f"{'ok  ' if ok else 'FAIL'} {sys.argv[3]}: val loss {run:.4f} against sync's {ref:.4f} ({(run / ref - 1) * 100:+.1f}%)")
sys.exit(0 if ok else 1)
PY
}

run sync1 --nproc 3 --ps_servers 1 && run ssp0_1 --nproc 3 --ps_servers 1 --ps_mode ssp && same ssp0_1 sync1
run sync2 --nproc 4 --ps_servers 2 && run ssp0_2 --nproc 4 --ps_servers 2 --ps_mode ssp && same ssp0_2 sync2

# the bound under a slowed worker: kept, and the check can fail (bound 1 on the same log)
if MT_INJECT_FAULT=slow_compute@1:20 run ssp2 --nproc 4 --ps_servers 2 --ps_mode ssp --staleness 2; then
  python3 "$here/ps_stale.py" "$scratch/ssp2.log" 2 || { echo "FAIL ssp2: past its bound"; failed=1; }
  if python3 "$here/ps_stale.py" "$scratch/ssp2.log" 1 >/dev/null; then
    echo "FAIL ssp2: the check passes bound 1 too (it cannot fail, or nothing ran ahead)"; failed=1
  fi
  if (cd "$scratch" && python3 "$here/compare_runs.py" sync2 ssp2 0 grad_norm >/dev/null); then
    echo "FAIL ssp2 equals sync bit for bit: the comparison cannot fail"; failed=1
  fi
  near ssp2 sync2
fi
if run async --nproc 4 --ps_servers 2 --ps_mode async; then
  grep -q "ps staleness: server 0 applied 40 gradients (async)" "$scratch/async.log" ||
    { echo "FAIL async: no staleness report of 40 gradients"; failed=1; }
  grep "ps staleness" "$scratch/async.log"
  near async sync2
fi

# kill MODE SLOW: worker 1 killed after the servers applied its clock 5 (worker SLOW slowed so
# that the job is still on); restarted alone, it rejoins.
kill_worker() {
  local mode=$1 out=$scratch/kill_$1
  MT_INJECT_FAULT=slow_compute@$2:40 timeout 60 "$meshtrain" train "${ps_job[@]}" --steps 60 \
    --out "$out" --nproc 4 --ps_servers 2 --ps_mode "$mode" --max-restarts 1 >"$out.log" 2>&1 &
  local job_pid=$! pid="" i
  for i in $(seq 200); do
    grep -q "ps apply: server 0 .*worker 1 .*clock 5\|ps apply: server 0 .*clock 5 worker 1" \
      "$out.log" 2>/dev/null && break
    sleep 0.05
  done
  pid=$(sed -n 's/.*start: rank 1 of 4 .*pid \([0-9]*\)$/\1/p' "$out/logs/rank1.log" 2>/dev/null | head -1)
  [[ -n $pid ]] && kill -9 "$pid"
  local status=0
  wait "$job_pid" || status=$?
  if [[ -z $pid || $status -ne 0 ]] || ! grep -q "worker 1 dropped" "$out.log" ||
     ! grep -q "worker 1 rejoined at clock" "$out.log"; then
    echo "FAIL kill $mode: exit $status, killed pid '${pid}'"
    grep -v "ps apply\|ps pull" "$out.log" | tail -n 15
    failed=1
    return
  fi
  # pushes of the rejoined life applied after its rejoin
  local after
  after=$(sed -n '/server 0: worker 1 rejoined/,$p' "$out.log" | grep -c "ps apply: server 0.*worker 1" || true)
  echo "ok   kill $mode: worker 1 dropped, rejoined ($(grep -o 'worker 1 rejoined at clock [0-9]*' "$out.log" | head -1)), $after of its gradients applied after"
  [[ $after -gt 0 ]] || { echo "FAIL kill $mode: no gradient of the rejoined worker applied"; failed=1; }
}
kill_worker async 1
kill_worker ssp 0
exit $failed
