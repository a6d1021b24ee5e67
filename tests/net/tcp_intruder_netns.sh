#!/usr/bin/env bash
# Training over tcp and hier with an intruder on the network: three namespaces on one bridge,
# node 0 and node 1 of the job and a host without the secret. While the job builds its meshes
# (node 1's workers start 3 s late, so node 0's listeners wait for them) the intruder attacks every
# listener the test finds (a scan's connect-and-close, a forged hello with the world's id in the
# bare and the handshake form, garbage, a silent connection) and sweeps both nodes' ephemeral
# ports while the job trains. The losses must equal those of a run without the intruder, and
# the job's log must name every connection it refused.
# Needs root (ip netns) and python3. Usage: tcp_intruder_netns.sh MESHTRAIN
set -uo pipefail
mt=$1
here=$(cd "$(dirname "$0")" && pwd)
skip=77 # ctest's SKIP_RETURN_CODE for this test

if [ "$(id -u)" != 0 ] || ! command -v ip > /dev/null || ! command -v python3 > /dev/null; then
  echo "SKIPPED: needs root, ip (iproute2) and python3" >&2
  exit $skip
fi

tag=mti$$
net=10.216.$(($$ % 250))
ns_hub=${tag}h
out=$(mktemp -d)
cleanup() {
  for x in a b i hub; do
    ns=$tag$x
    [ $x = hub ] && ns=$ns_hub
    for pid in $(ip netns pids "$ns" 2> /dev/null); do kill -KILL "$pid" 2> /dev/null; done
    ip netns del "$ns" 2> /dev/null || true
  done
  rm -rf "$out"
}
trap cleanup EXIT

if ! ip netns add "$ns_hub" 2> /dev/null; then
  echo "SKIPPED: this machine does not allow new network namespaces (no CAP_SYS_ADMIN?)" >&2
  exit $skip
fi
ip -n "$ns_hub" link add br0 type bridge
ip -n "$ns_hub" link set br0 up
host_number=1
for x in a b i; do # node 0, node 1, the intruder: $net.1, .2, .3
  ns=$tag$x
  ip netns add "$ns"
  ip link add "$tag$x" type veth peer name "$tag${x}p"
  ip link set "$tag$x" netns "$ns"
  ip link set "$tag${x}p" netns "$ns_hub"
  ip -n "$ns_hub" link set "$tag${x}p" master br0 up
  ip -n "$ns" addr add "$net.$host_number/24" dev "$tag$x"
  ip -n "$ns" link set "$tag$x" up
  ip -n "$ns" link set lo up
  host_number=$((host_number + 1))
done
addr_a=$net.1 addr_b=$net.2 addr_i=$net.3

fail() {
  echo "FAILED: $*" >&2
  exit 1
}
show() {
  for node in 0 1; do sed "s/^/    [$1 node $node] /" "$out/$1.node$node"; done
}

umask 077
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$out/secret"
umask 022
mkdir "$out/tmp"
for i in $(seq 1 200); do echo "line $i: the quick brown fox jumps over the lazy dog"; done \
  > "$out/text.txt"
"$mt" data text "$out/text.txt" --out "$out/corpus" > /dev/null || fail "no corpus"
train=("$mt" train --data "$out/corpus" --steps 200 --layers 2 --width 64 --heads 2 --context 32
  --batch 4 --sample_tokens 0 --eval_every 0 --threads 1 --save_model off --log_every 50)

# Every listening port in both nodes' namespaces but the store's, as "host port" lines.
watch_listeners() {
  while [ ! -e "$out/stop" ]; do
    for ns in ${tag}a ${tag}b; do
      ip netns exec "$ns" ss -ltnH 2> /dev/null | awk -v skip="$port" -v net="$net." \
        '{ n = split($4, p, ":"); host = substr($4, 1, length($4) - length(p[n]) - 1)
           if (p[n] != skip && index(host, net) == 1) print host, p[n] }'
    done >> "$out/targets"
    sleep 0.1
  done
}

# run LABEL BACKEND PROCS_PER_NODE ATTACKED: the job on both nodes, node 1's workers 3 s late.
port=$((29600 + $$ % 1000))
run() {
  local label=$1 backend=$2 procs=$3 attacked=$4 pids=() watcher intruder
  port=$((port + 1))
  rm -f "$out/stop" "$out/targets" "$out/report"
  touch "$out/targets" "$out/report"
  if [ "$attacked" = 1 ]; then
    ip netns exec ${tag}i python3 "$here/tcp_intruder.py" "$out/targets" "$out/report" \
      "$out/stop" "$addr_a" "$addr_b" &
    intruder=$!
    watch_listeners &
    watcher=$!
  fi
  for node in 0 1; do
    local ns=${tag}a addr=$addr_a late=()
    [ $node = 1 ] && ns=${tag}b addr=$addr_b
    [ $node = 1 ] && [ "$attacked" = 1 ] && late=(sh -c 'sleep 3; exec "$@"' late)
    ip netns exec "$ns" env TMPDIR="$out/tmp" MT_COMM_BACKEND=$backend MT_COMM_TIMEOUT=30 \
      MT_COMM_TCP_HOST=$addr MT_COMM_HOST_IDENTITY=netns \
      timeout -k 2 120 "$mt" launch --nnodes 2 --node-rank $node --master "$addr_a:$port" \
      --secret-file "$out/secret" --nproc-per-node "$procs" --join-timeout 20 \
      -- "${late[@]}" "${train[@]}" --out "$out/$label.run" > "$out/$label.node$node" 2>&1 &
    pids+=($!)
  done
  local rcs=""
  for pid in "${pids[@]}"; do
    wait "$pid"
    rcs="$rcs $?"
  done
  touch "$out/stop"
  if [ "$attacked" = 1 ]; then
    wait "$watcher" "$intruder"
  fi
  [ "$rcs" = " 0 0" ] || { show "$label"; fail "$label: the launchers exited$rcs"; }
  [ -s "$out/$label.run/metrics.jsonl" ] || { show "$label"; fail "$label: no metrics"; }
}

losses() { grep -o '"loss": *[^,}]*' "$1/metrics.jsonl"; }

for backend in tcp hier; do
  procs=1
  [ $backend = hier ] && procs=2
  echo "== $backend, $((2 * procs)) ranks on 2 nodes: a clean run, then one with the intruder"
  run "$backend-clean" $backend $procs 0
  run "$backend-attacked" $backend $procs 1
  cp "$out/report" "$out/$backend.report"
  [ "$(losses "$out/$backend-clean.run")" = "$(losses "$out/$backend-attacked.run")" ] ||
    { diff <(losses "$out/$backend-clean.run") <(losses "$out/$backend-attacked.run");
      fail "$backend: the losses differ from the clean run's"; }
  echo "  ok: $(losses "$out/$backend-clean.run" | wc -l) losses equal the clean run's"
  for kind in forged-bare forged garbage silent; do
    awk -v k=$kind '$1 == k && $4 == "challenged" { found = 1 } END { exit !found }' \
      "$out/report" ||
      { sed 's/^/    [intruder] /' "$out/report"; show "$backend-attacked"
        fail "$backend: no $kind connection reached a listener during a mesh build"; }
  done
  named=0
  while read -r kind target lport state; do
    [ "$state" = challenged ] || continue
    grep -q "refused a connection from $addr_i:$lport:" "$out/$backend-attacked.node0" \
      "$out/$backend-attacked.node1" ||
      { show "$backend-attacked"
        fail "$backend: the $kind connection from port $lport to $target is not named"; }
    named=$((named + 1))
  done < <(awk '$4 == "challenged"' "$out/report")
  echo "  ok: all $named intruder connections that reached a listener are named, e.g.:"
  grep -h "refused a connection from $addr_i" "$out/$backend-attacked.node"* | sort -u -t: -k4 |
    head -n 4 | sed 's/^/      /'
done
echo "training with an intruder on the network: ok"
