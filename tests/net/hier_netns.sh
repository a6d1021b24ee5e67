#!/usr/bin/env bash
# The hier back end across two "hosts": two network namespaces joined by a veth pair, two
# or three ranks in each, running the collective matrix and the group scenarios. Needs root (ip netns).
# Usage: hier_netns.sh TEST_COMM_COLLECTIVES TEST_COMM_GROUPS
set -euo pipefail
collectives=$1 groups=$2
skip=77 # ctest's SKIP_RETURN_CODE for this test

if [ "$(id -u)" != 0 ] || ! command -v ip > /dev/null; then
  echo "SKIPPED: needs root and ip (iproute2) to make network namespaces" >&2
  exit $skip
fi

tag=mt$$
ns_a=${tag}a ns_b=${tag}b
addr_a=10.213.$(($$ % 250)).1 addr_b=10.213.$(($$ % 250)).2
cleanup() {
  ip netns del "$ns_a" 2> /dev/null || true
  ip netns del "$ns_b" 2> /dev/null || true
}
trap cleanup EXIT

. "$(dirname "$0")/netns_pair.sh"
make_netns_pair

# Runs one test program as two nodes, one per namespace; the store lives in namespace a.
# Each run gets its own port, so a node can never meet a store left from the run before.
port=29400
run_on_both() {
  port=$((port + 1))
  local pids=() status=0
  for node in 0 1; do
    local ns=$ns_a addr=$addr_a
    [ $node = 1 ] && ns=$ns_b addr=$addr_b
    ip netns exec "$ns" env MT_TEST_NNODES=2 MT_TEST_NODE_RANK=$node \
      MT_TEST_MASTER="$addr_a:$port" MT_JOB_SECRET=hier-netns-test-secret-0123 \
      MT_COMM_BACKEND=hier MT_COMM_HOST_IDENTITY=netns \
      MT_COMM_TCP_HOST="$addr" MT_COMM_TIMEOUT=60 MT_COMM_DEBUG=1 \
      timeout 240 "$@" > "$out/node$node" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do
    wait "$pid" || status=1
  done
  sed 's/^/  [a] /' "$out/node0"
  sed 's/^/  [b] /' "$out/node1"
  return $status
}

out=$(mktemp -d)
trap 'cleanup; rm -rf "$out"' EXIT
failed=0
echo "== collective matrix, 4 ranks (2 per namespace: shm inside, tcp across)"
run_on_both "$collectives" 4 4 || failed=1
grep -q "hier: 4 ranks on 2 hosts" "$out/node0" || { echo "rank 0 did not see 2 hosts" >&2; failed=1; }
echo "== collective matrix, 2 ranks (1 per namespace: tcp only)"
run_on_both "$collectives" 2 2 || failed=1
for scenario in groups multi async p2p errors; do
  echo "== group scenario $scenario, 6 ranks (3 per namespace)"
  run_on_both "$groups" "$scenario" 6 || failed=1
done
[ $failed = 0 ] && echo "hier across two network namespaces: ok"
exit $failed
