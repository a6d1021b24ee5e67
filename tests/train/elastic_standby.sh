#!/usr/bin/env bash
# No node that must live: two launchers on loopback train dp 4 x ZeRO 2 under --nnodes 1:2 --standby;
# node 1 hosts the standby store. Node 0 is lost whole at step 8 (rank 0 SIGKILLs its launcher,
# which hosts the store, then itself): node 1's launcher moves to the standby, leads the next
# round alone and the job resumes step 6 on dp 2, ending within 1e-5 of the uninterrupted dp 4
# run (the global batch stays 24 sequences, as in elastic.sh's shrink).
# usage: elastic_standby.sh MESHTRAIN
set -euo pipefail
meshtrain=$1
scratch=
source "$(dirname "$0")/genesis_setup.sh"
source "$here/expect.sh"

port_offset=11000
source "$here/elastic_lib.sh"

reference="$scratch/uninterrupted"
train_into "$reference" --nproc 4
out="$scratch/standby"
MT_INJECT_FAULT=kill_node@0:8 node "$out.node0" 0 --nnodes 1:2 --last-call 2 --max-restarts 1 --standby \
  -- "$meshtrain" train "${job[@]}" --out "$out"
pid0=$!
MT_INJECT_FAULT=kill_node@0:8 node "$out.node1" 1 --nnodes 1:2 --last-call 2 --max-restarts 1 --standby \
  -- "$meshtrain" train "${job[@]}" --out "$out"
pid1=$!
wait_for rc0 $pid0; wait_for rc1 $pid1
[ "$rc0" = 137 ] || fail "node 0's launcher was to die of SIGKILL (137), not exit $rc0"
[ "$rc1" = 0 ] || fail "node 1 did not go on with the standby store: exit $rc1"
expect_in "$out.node1" "node 0's store is lost: the standby store on node 1 \(127\.0\.0\.1:[0-9]+\) takes over, and node 1 leads the rounds from now on" "take-over"
expect_in "$out.node1" "restarting the job \(1 of 1\)" "restart"
expect_in "$out.node1" "attempt 1 runs on 1 node of --nnodes 1:2 \(1\), 2 workers: this node \(1\) has ranks 0-1" "node 1 alone"
expect_in "$out.node1" "\[0\] resumed from '.*/ckpt/step_6' at step 6" "resume"
expect_in "$out.node1" "dp 2, zero 2" "dp 2"
/usr/bin/python3 "$here/compare_runs.py" "$reference" "$out" 1e-5 || fail "the job on the standby left the run"
left=$(pgrep -f -- "--out $out" || true)
[ -z "$left" ] || fail "processes of the job left: $(ps -o pid=,args= -p "${left//$'\n'/,}")"
[ "$failed" = 0 ] && echo "ok node 0 (the store's host) lost at step 8: the standby on node 1 took over, the job resumed step 6 on node 1 alone (dp 2), within 1e-5"
exit $failed
