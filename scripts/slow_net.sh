#!/usr/bin/env bash
# A slow network on one machine: H "hosts" as network namespaces, each joined to a bridge (in a
# switch namespace of its own) by a veth pair rate-limited both ways (tbf), one launcher per host
# with the hier back end (shared memory inside a host, tcp between hosts); tests and benchmarks
# reuse it. Every name carries this shell's pid, so runs at once never collide; the trap deletes
# every namespace it made (with them their links) however the script ends.
#
# Usage (as root):
#   scripts/slow_net.sh [--hosts H] [--rate RATE] [--nproc N] [--timeout S] [--logs DIR] \
#                       MESHTRAIN -- COMMAND...
# runs `MESHTRAIN launch ... --nproc-per-node N -- COMMAND...` in each of H hosts (default 2 x 1
# rank, 100mbit: tc's rate syntax, e.g. 1gbit), each bounded by S seconds (default 600). Host 0's
# output goes to stdout; each host's also to DIR/host<h>.log when --logs is given, and every host's
# is printed when one fails. Exit: 0 when every host's launcher succeeded, else the first failing
# host's code (124: timed out). `--dry` builds the network, checks it, and tears it down.
set -uo pipefail
skip=77 # what the tests take as "cannot run here"
hosts=2 rate=100mbit nproc=1 limit=600 logs="" dry=0
usage() {
  sed -n '8,16p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case $1 in
  --hosts) hosts=${2:?}; shift 2 ;;
  --rate) rate=${2:?}; shift 2 ;;
  --nproc) nproc=${2:?}; shift 2 ;;
  --timeout) limit=${2:?}; shift 2 ;;
  --logs) logs=${2:?}; shift 2 ;;
  --dry) dry=1; shift ;;
  -h | --help) usage ;;
  -*) echo "slow_net.sh: unknown option '$1'" >&2; usage ;;
  *) break ;;
  esac
done
mt=${1:-}
[ $dry = 1 ] || { [ -n "$mt" ] && [ "${2:-}" = -- ] && [ $# -ge 3 ]; } || usage
[ $dry = 1 ] || shift 2
case $hosts in '' | *[!0-9]*) echo "slow_net.sh: --hosts '$hosts' is not a count" >&2; exit 2 ;; esac
[ "$hosts" -ge 1 ] && [ "$hosts" -le 200 ] || { echo "slow_net.sh: --hosts must be 1 to 200" >&2; exit 2; }
if [ "$(id -u)" != 0 ] || ! command -v ip > /dev/null || ! command -v tc > /dev/null; then
  echo "slow_net.sh: needs root and iproute2 (ip, tc) to make network namespaces" >&2
  exit $skip
fi

tag=sn$$ # namespace and link names: at most 15 characters, unique while this shell lives
switch=${tag}sw
made=()  # the namespaces made so far, deleted by the trap
work=$(mktemp -d)
cleanup() {
  local rc=$? ns pid left
  trap - EXIT TERM INT HUP
  # SIGTERM to what runs in our namespaces (a launcher then stops and reaps its workers), SIGKILL
  # to what outlives 5 s; then the namespaces, whose deletion removes their veths and bridge.
  for _ in $(seq 50); do
    left=$(for ns in "${made[@]}"; do ip netns pids "$ns" 2> /dev/null; done)
    [ -n "$left" ] || break
    for pid in $left; do kill -TERM "$pid" 2> /dev/null; done
    sleep 0.1
  done
  for ns in "${made[@]}"; do
    for pid in $(ip netns pids "$ns" 2> /dev/null); do kill -KILL "$pid" 2> /dev/null; done
  done
  wait 2> /dev/null
  for ns in "${made[@]}"; do ip netns del "$ns" 2> /dev/null; done
  rm -rf "$work"
  exit $rc
}
trap cleanup EXIT
trap 'echo "slow_net.sh: interrupted; removing the namespaces" >&2; exit 143' TERM
trap 'exit 130' INT
trap 'exit 129' HUP

fail() {
  echo "slow_net.sh: $*" >&2
  exit 1
}
addr() { echo "10.77.$(($1 / 250)).$(($1 % 250 + 1))"; }

# The switch: a bridge in a namespace of its own, so nothing is added to the caller's network.
ip netns add "$switch" || fail "cannot make network namespace $switch (no CAP_SYS_ADMIN?)"
made+=("$switch")
ip -n "$switch" link add "${tag}br" type bridge || fail "cannot make a bridge"
ip -n "$switch" link set "${tag}br" up
for h in $(seq 0 $((hosts - 1))); do
  ns=${tag}h$h
  ip netns add "$ns" || fail "cannot make network namespace $ns"
  made+=("$ns")
  ip link add "${tag}e$h" netns "$ns" type veth peer name "${tag}p$h" netns "$switch" ||
    fail "cannot make the veth pair of host $h"
  ip -n "$switch" link set "${tag}p$h" master "${tag}br"
  ip -n "$ns" addr add "$(addr $h)/16" dev "${tag}e$h"
  ip -n "$ns" link set lo up
  ip -n "$ns" link set "${tag}e$h" up
  ip -n "$switch" link set "${tag}p$h" up
  # The rate both ways: the host's sending on its end, its receiving on the switch's end.
  ip netns exec "$ns" tc qdisc add dev "${tag}e$h" root tbf rate "$rate" burst 64kb latency 100ms ||
    fail "tc cannot limit host $h to '$rate' (tbf)"
  ip netns exec "$switch" tc qdisc add dev "${tag}p$h" root tbf rate "$rate" burst 64kb latency 100ms ||
    fail "tc cannot limit the switch's port $h to '$rate' (tbf)"
done
if [ $dry = 1 ]; then
  for h in $(seq 0 $((hosts - 1))); do
    ip netns exec "${tag}h$h" tc qdisc show dev "${tag}e$h" | grep -q "tbf" ||
      fail "host $h has no rate limit"
    ip -n "$switch" link show "${tag}p$h" | grep -q "master ${tag}br" || fail "host $h is not on the bridge"
  done
  echo "slow_net.sh: $hosts hosts at $rate each ($tag): built"
  exit 0
fi

head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$work/secret"
chmod 600 "$work/secret"
mkdir "$work/tmp"
# Inside a host: a private /dev/shm (ip netns exec gives the command a mount namespace of its
# own), then the launcher, bounded by the timeout; its SIGTERM reaches the launcher, which stops
# its workers.
inner='mount -t tmpfs -o mode=1777 slow-net /dev/shm || { echo "cannot mount a private /dev/shm" >&2; exit 90; }
       exec "$@"'
pids=()
for h in $(seq 0 $((hosts - 1))); do
  : > "$work/host$h.log" # before tail follows it
  ip netns exec "${tag}h$h" env MT_COMM_BACKEND=hier MT_COMM_HOST_IDENTITY=netns \
    MT_COMM_TCP_HOST="$(addr $h)" TMPDIR="$work/tmp" \
    bash -c "$inner" host timeout -k 8 "$limit" "$mt" launch --nnodes "$hosts" --node-rank "$h" \
    --master "$(addr 0):29500" --secret-file "$work/secret" --nproc-per-node "$nproc" -- "$@" \
    > "$work/host$h.log" 2>&1 &
  pids+=($!)
done
tail -n +1 -f "$work/host0.log" --pid "${pids[0]}" &
follower=$!
rc=0 failed=""
for h in $(seq 0 $((hosts - 1))); do
  wait "${pids[$h]}"
  code=$?
  if [ $code != 0 ] && [ $rc = 0 ]; then rc=$code; fi
  [ $code = 0 ] || failed="$failed $h:$code"
done
wait $follower 2> /dev/null
if [ -n "$logs" ]; then
  mkdir -p "$logs" && cp "$work"/host*.log "$logs"/
fi
if [ $rc != 0 ]; then
  for h in $(seq 1 $((hosts - 1))); do sed "s/^/[host $h] /" "$work/host$h.log" >&2; done
  echo "slow_net.sh: failed on host:exit$failed (124: no end within $limit s)" >&2
fi
exit $rc
