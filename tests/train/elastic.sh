#!/usr/bin/env bash
# Elastic restarts: two launchers (nodes) on loopback train dp4 x zero 2 under --nnodes 1:2;
# node 1 is lost whole at step 8 (its rank 2 kills its launcher, then itself), and node 0
# restarts alone, resumes step 6 on dp 2 and ends within 1e-5 of the uninterrupted dp 4 run.
# The same loss under a fixed --nnodes 2 fails at once, saying why; a launcher killed while its
# workers sleep is noticed by node 0's launcher itself, and so is one stopped by SIGSTOP (silent
# past the join timeout); the last call starts a job on nodes 0
# and 2 (group ranks 0 and 1), and node 1, come late, waits until the job ends without it
# (its workers save no checkpoint: elastic_grow.sh joins one that does); a round short of MIN fails
# within the join timeout; launchers with other settings are refused; bad --nnodes values.
# usage: elastic.sh MESHTRAIN   (also under the sanitizers: a small job)
set -euo pipefail
meshtrain=$1
scratch=
source "$(dirname "$0")/genesis_setup.sh"
source "$here/expect.sh"

launcher_seconds=150 join_seconds=60
port_offset=0
source "$here/elastic_lib.sh"

# --- a node lost whole: the job goes on, on the node left ---------------------------------
reference="$scratch/uninterrupted"
train_into "$reference" --nproc 4
out="$scratch/elastic"
port=$((port + 1))
MT_INJECT_FAULT=kill_node@2:8 node "$out.node0" 0 --nnodes 1:2 --max-restarts 1 -- \
  "$meshtrain" train "${job[@]}" --out "$out"
pid0=$!
MT_INJECT_FAULT=kill_node@2:8 node "$out.node1" 1 --nnodes 1:2 --max-restarts 1 -- \
  "$meshtrain" train "${job[@]}" --out "$out"
pid1=$!
wait_for rc0 $pid0; wait_for rc1 $pid1
[ "$rc1" = 137 ] || fail "node 1's launcher was to die of SIGKILL (137), not exit $rc1"
[ "$rc0" = 0 ] || fail "node 0 did not go on alone: exit $rc0"
expect_in "$out.node0" "the launcher of node 1 disconnected before its workers ended" "lost node"
expect_in "$out.node0" "restarting the job \(1 of 1\)" "restart"
expect_in "$out.node0" "attempt 1 runs on 1 node of --nnodes 1:2 \(0\), 2 workers: this node \(0\) has ranks 0-1" "shrink"
expect_in "$out.node0" "\[0\] resumed from '.*/ckpt/step_6' at step 6" "resume"
expect_in "$out.node0" "dp 2, zero 2" "dp 2"
/usr/bin/python3 "$here/compare_runs.py" "$reference" "$out" 1e-5 || fail "the shrunk job left the run"
left=$(pgrep -f -- "--out $out" || true)
[ -z "$left" ] || fail "processes of the lost node left: $(ps -o pid=,args= -p "${left//$'\n'/,}")"
[ "$failed" = 0 ] && echo "ok node 1 lost at step 8 under --nnodes 1:2: restarted on node 0 alone (dp 2) from step 6, within 1e-5"

# --- the same loss under a fixed --nnodes 2: a clear error at once, not the join timeout ---
out="$scratch/fixed"
port=$((port + 1))
started=$SECONDS
MT_INJECT_FAULT=kill_node@2:8 node "$out.node0" 0 --nnodes 2 --max-restarts 1 -- \
  "$meshtrain" train "${job[@]}" --out "$out"
pid0=$!
MT_INJECT_FAULT=kill_node@2:8 node "$out.node1" 1 --nnodes 2 --max-restarts 1 -- \
  "$meshtrain" train "${job[@]}" --out "$out"
pid1=$!
wait_for rc0 $pid0; wait_for rc1 $pid1
[ "$rc0" = 1 ] || fail "fixed --nnodes 2: node 0 exited $rc0, not 1"
expect_in "$out.node0" "error: launch: attempt 1 cannot start: the launcher of node 1 left the job, and --nnodes 2 needs at least 2 nodes \(--nnodes MIN:MAX lets a job go on with fewer\)" "fixed"
[ $((SECONDS - started)) -lt 50 ] || fail "fixed --nnodes 2 took $((SECONDS - started)) s to fail"
[ "$failed" = 0 ] && echo "ok the same loss under --nnodes 2 fails at once ($((SECONDS - started)) s): $(grep -o 'attempt 1 cannot start[^(]*' "$out.node0")"

# --- a launcher killed while its workers sleep: only node 0's launcher can notice ----------
# sleepy_nodes LOG: two launchers (pids $pid0 and $pid1) on a new port whose workers sleep on
# the first attempt and end at once on a restart, once node 1's workers run.
sleepy_nodes() {
  local sleepy='echo "rank $RANK of $WORLD_SIZE"; [ "$MT_RESTART_COUNT" = 0 ] && exec sleep 60; exit 0'
  port=$((port + 1))
  started=$SECONDS
  node "$1.node0" 0 --nnodes 1:2 --max-restarts 1 -- sh -c "$sleepy"
  pid0=$!
  node "$1.node1" 1 --nnodes 1:2 --max-restarts 1 -- sh -c "$sleepy"
  pid1=$!
  for _ in $(seq 150); do
    grep -q "rank 3 of 4" "$1.node1" && break
    sleep 0.1
  done
}
log="$scratch/asleep"
sleepy_nodes "$log"
pkill -KILL -f -- "launch --node-rank 1 --master 127.0.0.1:$port" || fail "no launcher of node 1 to kill"
wait_for rc0 $pid0; wait_for rc1 $pid1
[ "$rc0" = 0 ] || fail "asleep: node 0 exited $rc0, not 0"
[ $((SECONDS - started)) -lt 20 ] || fail "asleep: node 0 took $((SECONDS - started)) s (its workers sleep 60 s)"
expect_in "$log.node0" "the launcher of node 1 disconnected before its workers ended" "asleep"
expect_in "$log.node0" "\[1\] rank 1 of 2" "asleep: restarted alone"
[ "$failed" = 0 ] && echo "ok node 1's launcher killed while the workers slept: node 0 restarted alone in $((SECONDS - started)) s"

# --- a launcher stopped (SIGSTOP) while its workers sleep: its connection stays open, but it
# says nothing to the store past the silence limit (the join timeout, at least the 3 s grace
# plus 5 s), so node 0 takes its node for lost and restarts alone
log="$scratch/stopped"
join_seconds=3
sleepy_nodes "$log"
launcher1=$(pgrep -f -- "launch --node-rank 1 --master 127.0.0.1:$port" || true)
if [ -n "$launcher1" ]; then
  kill -STOP $launcher1
  wait_for rc0 $pid0
  kill -KILL $launcher1
  wait_for rc1 $pid1
  [ "$rc0" = 0 ] || fail "stopped: node 0 exited $rc0, not 0"
  [ $((SECONDS - started)) -lt 30 ] ||
    fail "stopped: node 0 took $((SECONDS - started)) s (the silence limit is 8 s)"
  expect_in "$log.node0" "the launcher of node 1 disconnected before its workers ended \\(node lost, or its launcher stopped or hung\\?\\)" "stopped"
  expect_in "$log.node0" "\\[1\\] rank 1 of 2" "stopped: restarted alone"
  [ "$failed" = 0 ] && echo "ok node 1's launcher stopped while the workers slept: node 0 restarted alone in $((SECONDS - started)) s"
else
  fail "no launcher of node 1 to stop"
fi
join_seconds=60

# --- the last call: nodes 0 and 2 of --nnodes 2:3 (ranks renumbered densely); node 1 late ---
hold="$scratch/hold"
say_rank='echo "rank $RANK of $WORLD_SIZE, group $GROUP_RANK of $GROUP_WORLD_SIZE"
          for _ in $(seq 300); do [ -e "$0" ] && exit 0; sleep 0.1; done; exit 3'
log="$scratch/lastcall"
port=$((port + 1))
node "$log.node0" 0 --nnodes 2:3 --last-call 1 -- sh -c "$say_rank" "$hold"
pid0=$!
node "$log.node2" 2 --nnodes 2:3 --last-call 1 -- sh -c "$say_rank" "$hold"
pid2=$!
for _ in $(seq 150); do
  grep -q "attempt 0 runs" "$log.node0" && break
  sleep 0.1
done
node "$log.node1" 1 --nnodes 2:3 --last-call 1 -- sh -c "$say_rank" "$hold"
pid1=$!
for _ in $(seq 150); do # the job holds until the late node waits
  grep -q "it waits" "$log.node1" && break
  sleep 0.1
done
touch "$hold"
wait_for rc0 $pid0; wait_for rc1 $pid1; wait_for rc2 $pid2
[ "$rc0 $rc1 $rc2" = "0 0 0" ] || fail "last call: the launchers exited $rc0, $rc1, $rc2 (want 0 0 0)"
expect_in "$log.node0" "attempt 0 runs on 2 nodes of --nnodes 2:3 \(0, 2\), 4 workers: this node \(0\) has ranks 0-1" "last call"
expect_in "$log.node2" "\[3\] rank 3 of 4, group 1 of 2" "dense group rank"
expect_in "$log.node1" "node 1 came after attempt 0 started: it waits for the job's next checkpoint" "late node waits"
expect_in "$log.node1" "the job finished before it took node 1 in" "late node left out"
[ "$failed" = 0 ] && echo "ok --nnodes 2:3 --last-call 1 started on nodes 0 and 2 (node 2 as group 1, ranks 2-3); node 1, late, waited and the job (no checkpoint) ended without it"

# --- short of MIN within the join timeout; settings that differ; bad --nnodes --------------
port=$((port + 1))
must_fail "error: launch: waiting 2 s for the launchers of attempt 0: 1 of the 2 nodes that --nnodes 2:3 needs came \(missing: nodes 1, 2\)" \
  timeout 30 "$meshtrain" launch --nnodes 2:3 --node-rank 0 --master "127.0.0.1:$port" \
  --secret-file "$scratch/secret" --nproc-per-node 1 --join-timeout 2 -- true
# node 0's reason reaches node 1: a fixed --nnodes 3 without node 2
log="$scratch/short"
port=$((port + 1))
node "$log.node0" 0 --nnodes 3 --join-timeout 2 -- true
pid0=$!
node "$log.node1" 1 --nnodes 3 --join-timeout 2 -- true
wait_for rc0 $pid0; wait_for rc1 $!
[ "$rc0 $rc1" = "1 1" ] || fail "short: the launchers exited $rc0, $rc1 (want 1 1)"
for n in 0 1; do
  expect_in "$log.node$n" "error: launch: waiting 2 s for the launchers of attempt 0: 2 of the 3 nodes that --nnodes 3 needs came \(missing: node 2\)" "node $n's reason"
done
# MIN in: the join timeout no longer applies, the last call does
port=$((port + 1))
node "$log.min" 0 --nnodes 1:2 --join-timeout 1 --last-call 2 -- true
wait_for rc0 $!
[ "$rc0" = 0 ] || { fail "MIN in, join timeout 1 s, last call 2 s: exit $rc0"; cat "$log.min"; }
log="$scratch/differ"
port=$((port + 1))
touch "$hold"
node "$log.node0" 0 --nnodes 1:2 --last-call 30 -- sh -c "$say_rank" "$hold"
pid0=$!
node "$log.node1" 1 --nnodes 2 -- sh -c "$say_rank" "$hold"
wait_for rc1 $!; wait_for rc0 $pid0
[ "$rc0 $rc1" = "0 1" ] || fail "differing --nnodes: the launchers exited $rc0, $rc1 (want 0 1)"
expect_in "$log.node1" "error: launch: node 1 was started with --nnodes 2 --nproc-per-node 2 --max-restarts 0 --join-timeout 60 --last-call 30, but node 0 with --nnodes 1:2 (.*): every launcher of a job needs the same" "differing settings"
expect_in "$log.node0" "\[1\] rank 1 of 2, group 0 of 1" "node 0 alone"
for bad in "3:2|MIN 3 is above M 2" "0:2|--nnodes MIN '0'" "x|--nnodes 'x'" "1:|--nnodes M ''"; do
  must_fail "${bad#*|}" "$meshtrain" launch --nnodes "${bad%%|*}" --nproc-per-node 1 -- true
done
[ "$failed" = 0 ] && echo "ok short of MIN, differing settings and bad --nnodes are clear errors"
exit $failed
