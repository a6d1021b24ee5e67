#!/usr/bin/env bash
# meshtrain launch across two "hosts": two network namespaces joined by a veth pair, one
# launcher in each (node 0 hosts the store on its veth address), two workers per node.
# Checks that a job succeeds over hier and tcp, that a failure on one node stops both nodes
# and both name it, that a wrong secret and a second launcher with the same --node-rank are
# refused while the right job still runs, that under --nnodes 1:2 the loss of node 1 (every
# process in its namespace killed) restarts the job on node 0 alone, as does node 1 cut off
# (its link down: nothing closes, the store's keepalive finds it gone), and that nothing is left
# behind: no process in
# either namespace, no mt-* segment in either node's /dev/shm (each launcher gets a private
# /dev/shm, as two hosts would have), no flight recorder folder after a success.
# Every rank listens on its own namespace's veth address (MT_COMM_TCP_HOST), over hier too:
# hier's tcp links listen on 127.0.0.1 otherwise, which the other namespace cannot reach.
# Needs root (ip netns, mount). Usage: launch_netns.sh MESHTRAIN
set -uo pipefail
mt=$1
skip=77 # ctest's SKIP_RETURN_CODE for this test

. "$(dirname "$0")/netns_pair.sh"
netns_pair_begin mtl 214
if ! ip netns exec "$ns_a" mount -t tmpfs mt-launch-netns /dev/shm 2> /dev/null; then
  echo "SKIPPED: cannot mount a private /dev/shm inside a network namespace" >&2
  exit $skip
fi

fail() {
  echo "FAILED: $*" >&2
  exit 1
}
ok() { echo "  ok: $*"; }
show() { # LABEL: both nodes' output, indented
  for node in 0 1; do
    [ -f "$out/$1.node$node" ] && sed "s/^/    [node $node] /" "$out/$1.node$node"
  done
}
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

# The job's secret, and another job's (mode 600, as the launcher demands).
umask 077
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$out/secret"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$out/wrong-secret"
chmod 600 "$out/secret" "$out/wrong-secret"
umask 022
mkdir "$out/tmp"

# Runs inside a namespace (ip netns exec gives it its own mount namespace): a private
# /dev/shm, then the launcher; afterwards records the exit code, the end time and what is
# left in that /dev/shm. $1 = the record's path prefix, the rest = the command.
inner='mount -t tmpfs -o mode=1777 mt-launch-netns /dev/shm ||
         { echo "cannot mount a private /dev/shm" >&2; exit 90; }
       record=$1; shift
       "$@"; rc=$?
       echo "$rc $EPOCHREALTIME" > "$record.status"
       ls -A /dev/shm > "$record.shm"
       exit $rc'

# launcher LABEL NODE SECRET [VAR=VALUE...] -- COMMAND...: starts one launcher of the job on
# port $port in node NODE's namespace, in the background ($! is its pid); its output goes to
# $out/LABEL.nodeNODE. Every wait is bounded: the join, the peers, and the launcher itself.
launcher() {
  local label=$1 node=$2 secret=$3
  shift 3
  local ns=$ns_a addr=$addr_a vars=()
  [ "$node" = 1 ] && ns=$ns_b addr=$addr_b
  while [ "$1" != -- ]; do
    vars+=("$1")
    shift
  done
  shift
  ip netns exec "$ns" env MT_COMM_TIMEOUT=10 TMPDIR="$out/tmp" MT_COMM_TCP_HOST="$addr" \
    "${vars[@]}" bash -c "$inner" inner "$out/$label.node$node" \
    timeout -k 2 "$limit" "$mt" launch --nnodes "$nnodes" --node-rank "$node" --master "$addr_a:$port" \
    --secret-file "$secret" --nproc-per-node 2 --join-timeout 20 "${extra[@]}" -- "$@" \
    > "$out/$label.node$node" 2>&1 &
}

# run_job LABEL [VAR=VALUE...] -- COMMAND...: both nodes, the same command; waits for both
# launchers and sets rc0, rc1 and took0, took1 (seconds from the start to each one's end).
run_job() {
  local label=$1
  shift
  port=$((port + 1))
  local started=$EPOCHREALTIME pids=()
  for node in 0 1; do
    launcher "$label" $node "$out/secret" "$@"
    pids+=($!)
  done
  wait "${pids[@]}"
  read_status "$label" "$started"
}

# start_running LABEL SCRIPT: both launchers run sh -c SCRIPT "$mt" in the background (pids
# in $pids, the start in $started) and return once node 1's rank 2 has said its line.
start_running() {
  local label=$1 script=$2
  port=$((port + 1))
  started=$EPOCHREALTIME
  pids=()
  for node in 0 1; do
    launcher "$label" $node "$out/secret" MT_COMM_BACKEND=tcp -- sh -c "$script" "$mt"
    pids+=($!)
  done
  for _ in $(seq 100); do
    grep -q '^\[2\] rank 2 of 4' "$out/$label.node1" && return 0
    sleep 0.1
  done
  show "$label"
  fail "$label: the job did not start"
}

read_status() { # LABEL STARTED: rc0, rc1, took0, took1 from the records
  local rc end
  for node in 0 1; do
    if [ -f "$out/$1.node$node.status" ]; then
      read -r rc end < "$out/$1.node$node.status"
    else
      rc=none end=$EPOCHREALTIME
    fi
    eval "rc$node=\$rc took$node=\$(elapsed \$2 \$end)"
  done
}

# Nothing of the job is left: no process in either namespace, no mt-* segment in either
# node's /dev/shm, and (after a success) no flight recorder folder.
check_clean() {
  local label=$1 after=$2 left
  for ns in "$ns_a" "$ns_b"; do
    left=$(ip netns pids "$ns")
    [ -z "$left" ] || fail "$label: processes left in namespace $ns: $(ps -o pid=,args= -p \
      "$(echo $left | tr ' ' ,)")"
  done
  for node in 0 1; do
    [ -f "$out/$label.node$node.shm" ] || continue # a launcher that never got to run
    left=$(grep '^mt-' "$out/$label.node$node.shm" | tr '\n' ' ')
    [ -z "$left" ] || fail "$label: node $node left shared memory in /dev/shm: $left"
  done
  if [ "$after" = success ]; then
    left=$(ls -A "$out/tmp")
    [ -z "$left" ] || fail "$label: a successful job left in TMPDIR: $left"
  fi
  rm -rf "$out/tmp"/*
  ok "no process left in either namespace, no mt-* in either /dev/shm"
}

# The four "[r] rank r of 4 on ... (BACKEND): ... correct" lines, ranks 0-1 from node 0 and
# 2-3 from node 1.
check_ranks() {
  local label=$1 backend=$2
  for r in 0 1 2 3; do
    grep -Eq "^\[$r\] rank $r of 4 on .*\($backend\).* correct" "$out/$label.node$((r / 2))" ||
      { show "$label"; fail "$label: no line saying rank $r of 4 ($backend) was correct"; }
  done
  ok "ranks 0-3 of 4 report correct collectives over $backend"
}

port=$((29500 + $$ % 1000)) # a fresh port for every job (the namespaces are private anyway)
nnodes=2 extra=() limit=25 # what every launcher is given, besides its node and the command
check=("$mt" check --tp 2 --rounds 3)
begin=$EPOCHREALTIME

echo "== 1a. success over hier (namespaces as hosts): launch --nnodes 2 -- check --tp 2 --rounds 3"
run_job hier MT_COMM_BACKEND=hier MT_COMM_HOST_IDENTITY=netns MT_COMM_DEBUG=1 -- "${check[@]}"
[ "$rc0 $rc1" = "0 0" ] || { show hier; fail "hier: launchers exited $rc0 (node 0), $rc1 (node 1)"; }
ok "both launchers exited 0 (${took0} s, ${took1} s)"
check_ranks hier hier
grep -q "hier: 4 ranks on 2 hosts" "$out/hier.node0" ||
  { show hier; fail "hier: rank 0 did not see the two namespaces as 2 hosts"; }
ok "hier saw 4 ranks on 2 hosts"
check_clean hier success

echo "== 1b. success over tcp, each rank listening on its namespace's veth address"
run_job tcp MT_COMM_BACKEND=tcp -- "${check[@]}"
[ "$rc0 $rc1" = "0 0" ] || { show tcp; fail "tcp: launchers exited $rc0 (node 0), $rc1 (node 1)"; }
ok "both launchers exited 0 (${took0} s, ${took1} s)"
check_ranks tcp tcp
check_clean tcp success

# A failure: both launchers must end non-zero within 10 s (the grace period is 3 s, then
# SIGTERM, then SIGKILL 2 s later) and print the same failure, shared through the store.
failure_line() { grep '^meshtrain launch: error: ' "$out/$1.node$2" | tail -n 1; }
check_stopped() {
  local label=$1
  [ "$rc0" != 0 ] && [ "$rc0" != none ] && [ "$rc1" != 0 ] && [ "$rc1" != none ] ||
    { show "$label"; fail "$label: launchers exited $rc0 (node 0), $rc1 (node 1), not both non-zero"; }
  awk -v a="$took0" -v b="$took1" 'BEGIN { exit !(a < 10 && b < 10) }' ||
    { show "$label"; fail "$label: the launchers took ${took0} s and ${took1} s, not under 10 s"; }
  ok "both launchers exited non-zero ($rc0, $rc1) within 10 s (${took0} s, ${took1} s)"
  line0=$(failure_line "$label" 0) line1=$(failure_line "$label" 1)
  [ -n "$line0" ] && [ "$line0" = "$line1" ] ||
    { show "$label"; fail "$label: the launchers report different failures"; }
  ok "both report the same failure: ${line0#meshtrain launch: error: }"
}
rank3_killed='rank 3 \(pid [0-9]+ on host [^)]*\) was killed by signal 9'

echo "== 2a. node 1's rank 3 is killed (SIGKILL) only after the job ran: only the launchers"
echo "       can tell node 0 (its workers would sleep 30 s)"
run_job spread MT_COMM_BACKEND=hier MT_COMM_HOST_IDENTITY=netns -- sh -c \
  '"$0" check --tp 2 --rounds 3 || exit; [ "$RANK" = 3 ] && kill -KILL $$; exec sleep 30' "$mt"
check_stopped spread
echo "$line0" | grep -Eq "$rank3_killed" ||
  { show spread; fail "spread: the failure does not name rank 3 and signal 9"; }
ok "it names rank 3 and signal 9"
check_clean spread failure

echo "== 2b. rank 3 is killed inside its collectives (check --fail-rank 3 --fail-how kill)"
run_job kill MT_COMM_BACKEND=hier MT_COMM_HOST_IDENTITY=netns -- \
  "$mt" check --tp 2 --rounds 1000 --fail-rank 3 --fail-how kill --fail-round 2
check_stopped kill
grep -q "rank 3: failing on purpose (kill)" "$out/kill.node1" ||
  { show kill; fail "kill: rank 3 did not say it was failing on purpose"; }
if echo "$line0" | grep -Eq "$rank3_killed"; then
  ok "it names rank 3 and signal 9"
else
  # The first failure published wins; a rank that saw rank 3 vanish and exited 1 can get
  # there first when the cores are busy. Both nodes still agree and stop.
  echo "  note: the first failure published was a rank that noticed rank 3's death, not rank 3"
fi
check_clean kill failure

echo "== 3a. a launcher with another job's secret is refused; the right one then joins"
port=$((port + 1))
started=$EPOCHREALTIME
launcher secret 0 "$out/secret" MT_COMM_BACKEND=tcp -- "${check[@]}"
node0=$!
launcher wrong 1 "$out/wrong-secret" MT_COMM_BACKEND=tcp -- "${check[@]}"
wait $! && fail "wrong secret: the launcher was not refused"
grep -q "does not hold this job's secret" "$out/wrong.node1" ||
  { show wrong; fail "wrong secret: the launcher was refused without saying why"; }
ok "refused: $(grep -o "authentication failed: [^(]*" "$out/wrong.node1")"
launcher secret 1 "$out/secret" MT_COMM_BACKEND=tcp -- "${check[@]}"
wait $node0 $!
read_status secret "$started"
[ "$rc0 $rc1" = "0 0" ] || { show secret; fail "secret: launchers exited $rc0 (node 0), $rc1 (node 1)"; }
ok "the job with the right secret ran: both launchers exited 0"
check_ranks secret tcp
check_clean secret success

echo "== 3b. a second launcher claiming --node-rank 1 while the job runs is refused"
# Rank 2's line means node 1's launcher has joined; its workers then sleep for 3 s.
start_running twin '"$0" check --tp 2 --rounds 3 && exec sleep 3'
launcher twin2 1 "$out/secret" MT_COMM_BACKEND=tcp -- "${check[@]}"
wait $! && fail "twin: the second launcher of node 1 was not refused"
grep -q "node rank 1 has already joined this job.*same --node-rank" "$out/twin2.node1" ||
  { show twin2; fail "twin: the second launcher was refused without naming the node rank"; }
ok "refused: $(grep -o "node rank 1 has already joined[^(]*" "$out/twin2.node1")"
wait "${pids[@]}"
read_status twin "$started"
[ "$rc0 $rc1" = "0 0" ] || { show twin; fail "twin: launchers exited $rc0 (node 0), $rc1 (node 1)"; }
ok "the job itself went on: both launchers exited 0"
check_ranks twin tcp
check_clean twin success

echo "== 4. elastic: under --nnodes 1:2 --max-restarts 1, node 1 is lost whole (every process in"
echo "       its namespace killed) while the job runs; node 0 restarts it alone, on 2 ranks"
nnodes=1:2 extra=(--max-restarts 1)
# (the first attempt's workers sleep: they would never notice the loss themselves)
sleepy='"$0" check --tp 2 --rounds 3 || exit; [ "$MT_RESTART_COUNT" = 0 ] && exec sleep 70; exit 0'
start_running elastic "$sleepy"
for pid in $(ip netns pids "$ns_b"); do kill -KILL "$pid" 2> /dev/null; done
wait "${pids[@]}" 2> /dev/null # (bash would announce node 1's killed launcher)
read_status elastic "$started"
[ "$rc0" = 0 ] || { show elastic; fail "elastic: node 0 exited $rc0, not 0"; }
awk -v a="$took0" 'BEGIN { exit !(a < 20) }' || { show elastic; fail "elastic: node 0 took ${took0} s"; }
for want in "the launcher of node 1 disconnected before its workers ended" \
            "restarting the job \(1 of 1\)" \
            "attempt 1 runs on 1 node of --nnodes 1:2 \(0\), 2 workers: this node \(0\) has ranks 0-1" \
            "^\[1\] rank 1 of 2 on .*\(tcp\).* correct"; do
  grep -Eq -e "$want" "$out/elastic.node0" || { show elastic; fail "elastic: node 0 never said '$want'"; }
done
ok "node 0 named the lost node, restarted alone and ranks 0-1 of 2 ran correctly (${took0} s)"
check_clean elastic failure

echo "== 5. elastic: node 1 cut off (its veth down, every process alive) while the workers sleep:"
echo "       nothing closes; the store's keepalive probes find it gone and node 0 restarts alone"
limit=80
start_running cut "$sleepy"
cut_at=$EPOCHREALTIME
ip -n "$ns_b" link set "${tag}vb" down
wait "${pids[0]}"
read_status cut "$cut_at"
[ "$rc0" = 0 ] || { show cut; fail "cut: node 0 exited $rc0, not 0"; }
awk -v a="$took0" 'BEGIN { exit !(a < 60) }' || { show cut; fail "cut: node 0 took ${took0} s"; }
for want in "the launcher of node 1 disconnected before its workers ended" \
            "attempt 1 runs on 1 node of --nnodes 1:2 \(0\)" "^\[1\] rank 1 of 2 on .*correct"; do
  grep -Eq -e "$want" "$out/cut.node0" || { show cut; fail "cut: node 0 never said '$want'"; }
done
ok "node 0 found node 1 gone and finished alone ${took0} s after the cut"
wait "${pids[1]}" 2> /dev/null
read_status cut "$cut_at"
[ "$rc1" != 0 ] && [ "$rc1" != none ] || { show cut; fail "cut: node 1 exited $rc1"; }
grep -q "lost the job's store" "$out/cut.node1" || { show cut; fail "cut: node 1 did not say it lost the store"; }
ok "node 1, cut off, ended too (${took1} s after the cut, exit $rc1): it lost the job's store"
check_clean cut failure

echo "meshtrain launch across two network namespaces: ok ($(elapsed "$begin" "$EPOCHREALTIME") s)"
