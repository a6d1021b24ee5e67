#!/usr/bin/env bash
# A tcp peer that never answers: rank 0 publishes an address whose packets vanish on the way
# (a neighbour entry with a MAC nobody has, as for a powered-off host), and rank 1's connect
# must fail at MT_COMM_TIMEOUT naming it, not after the kernel's two minutes of SYN retries.
# Needs root (ip netns). Usage: tcp_blackhole_netns.sh MESHTRAIN
set -uo pipefail
mt=$1
skip=77 # ctest's SKIP_RETURN_CODE for this test

. "$(dirname "$0")/netns_pair.sh"
netns_pair_begin mtb 217
hole=$net.9
# Rank 0 can listen on the hole (its namespace owns it); namespace b sends its SYNs to a MAC
# that no interface has, so they are dropped without an answer.
ip -n "$ns_a" addr add "$hole/32" dev lo
ip -n "$ns_b" neigh add "$hole" lladdr 02:00:00:00:00:09 dev "${tag}vb" nud permanent

umask 077
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$out/secret"
mkdir "$out/tmp"
port=$((29500 + $$ % 1000))
timeout_s=4
started=$EPOCHREALTIME
pids=()
for node in 0 1; do
  ns=$ns_a host=$hole
  [ $node = 1 ] && ns=$ns_b host=$addr_b
  ip netns exec "$ns" env TMPDIR="$out/tmp" MT_COMM_BACKEND=tcp MT_COMM_TIMEOUT=$timeout_s \
    MT_COMM_TCP_HOST=$host \
    timeout -k 2 60 "$mt" launch --nnodes 2 --node-rank $node --master "$addr_a:$port" \
    --secret-file "$out/secret" --nproc-per-node 1 --join-timeout 20 -- "$mt" check --rounds 1 \
    > "$out/node$node" 2>&1 &
  pids+=($!)
done
rcs=()
for pid in "${pids[@]}"; do
  wait "$pid"
  rcs+=($?)
done
took=$(awk -v a="$started" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
show() { sed 's/^/    [node 0] /' "$out/node0"; sed 's/^/    [node 1] /' "$out/node1"; }
fail() {
  show
  echo "FAILED: $*" >&2
  exit 1
}
# timeout(1) exits 124 when it had to stop a launcher: the connect outlived the timeout.
for node in 0 1; do
  [ "${rcs[$node]}" != 0 ] || fail "node $node succeeded through a black hole"
  [ "${rcs[$node]}" != 124 ] && [ "${rcs[$node]}" != 137 ] ||
    fail "node $node was still waiting after 60 s (MT_COMM_TIMEOUT=$timeout_s)"
done
grep -q "connecting to $hole:[0-9]*: no answer within $timeout_s.0 s" "$out/node1" ||
  fail "rank 1 does not name the silent address $hole and the timeout"
grep -h "no answer" "$out/node1" | head -n 2 | sed "s/^/    /"
echo "  ok: rank 1 gave up on $hole after MT_COMM_TIMEOUT ($took s for the whole job)"
echo "tcp connect to a black hole: ok"
