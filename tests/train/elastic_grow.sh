#!/usr/bin/env bash
# Jobs that grow: under --nnodes 1:2 node 0 starts alone (dp 2 x ZeRO 2 on its 2 workers); node 1
# comes after the round closed and waits; at the next checkpoint the workers stop, the launchers
# meet again and the job goes on from that checkpoint on both nodes (dp 4), under --max-restarts
# 0 (a growth is no failure restart). The reference is the uninterrupted run on the final
# layout (dp 4): the global batch stays 24 sequences, so dp 2 and dp 4 do the same maths up to
# the order of the gradient sums (elastic.sh's shrink holds to 1e-5 the same way).
# usage: elastic_grow.sh MESHTRAIN
set -euo pipefail
meshtrain=$1
scratch=
source "$(dirname "$0")/genesis_setup.sh"
source "$here/expect.sh"

port_offset=7000
source "$here/elastic_lib.sh"

# --- 1 node, then 2: the job grows at its next checkpoint --------------------------------
reference="$scratch/uninterrupted"
train_into "$reference" --nproc 4
out="$scratch/grown"
# rank 0 computes 150 ms more per step on every attempt, so the newcomer comes mid-run
MT_INJECT_FAULT=slow_compute@0:150 node "$out.node0" 0 --nnodes 1:2 --last-call 0 -- \
  "$meshtrain" train "${job[@]}" --out "$out"
pid0=$!
wait_line "$out.node0" "attempt 0 runs on 1 node"
node "$out.node1" 1 --nnodes 1:2 --last-call 0 -- "$meshtrain" train "${job[@]}" --out "$out"
pid1=$!
wait_for rc0 $pid0; wait_for rc1 $pid1
[ "$rc0 $rc1" = "0 0" ] || fail "growth: the launchers exited $rc0, $rc1 (want 0 0)"
expect_in "$out.node1" "node 1 came after attempt 0 started: it waits" "newcomer waits"
expect_in "$out.node0" "\[0\] node 1 waits to join the job: stopping at the checkpoint of step (3|6|9)" "workers stop"
expect_in "$out.node0" "attempt 0 stopped at its checkpoint of step (3|6|9) so that the waiting node joins: the launchers meet again \(growth 1, not counted against --max-restarts\)" "growth logged"
expect_in "$out.node0" "attempt 1 runs on 2 nodes of --nnodes 1:2 \(0, 1\), 4 workers: this node \(0\) has ranks 0-1" "grown round"
expect_in "$out.node1" "attempt 1 runs on 2 nodes of --nnodes 1:2 \(0, 1\), 4 workers: this node \(1\) has ranks 2-3" "newcomer's ranks"
expect_in "$out.node0" "\[0\] resumed from '.*/ckpt/step_(3|6|9)' at step (3|6|9)" "resume"
expect_in "$out.node0" "dp 4, zero 2" "dp 4"
/usr/bin/python3 "$here/compare_runs.py" "$reference" "$out" 1e-5 || fail "the grown job left the run"
[ "$failed" = 0 ] && echo "ok 1 node grew to 2 at $(grep -o 'resumed from .* at step [0-9]*' "$out.node0" | grep -o 'step [0-9]*$') (dp 2 -> dp 4), within 1e-5 of the uninterrupted dp 4 run, no restart used"
exit $failed
