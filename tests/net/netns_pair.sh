# Sourced by the tests in tests/net: two network namespaces joined by a veth pair, each one a
# "host". Set tag, ns_a, ns_b, addr_a, addr_b and skip first; make_netns_pair exits $skip
# (saying why) where namespaces cannot be made. The caller's trap deletes them.
make_netns_pair() {
  if ! ip netns add "$ns_a" 2> /dev/null; then
    echo "SKIPPED: this machine does not allow new network namespaces (no CAP_SYS_ADMIN?)" >&2
    exit "$skip"
  fi
  ip netns add "$ns_b"
  ip link add "${tag}va" type veth peer name "${tag}vb"
  ip link set "${tag}va" netns "$ns_a"
  ip link set "${tag}vb" netns "$ns_b"
  ip -n "$ns_a" addr add "$addr_a/24" dev "${tag}va"
  ip -n "$ns_b" addr add "$addr_b/24" dev "${tag}vb"
  for ns in "$ns_a" "$ns_b"; do
    ip -n "$ns" link set lo up
  done
  ip -n "$ns_a" link set "${tag}va" up
  ip -n "$ns_b" link set "${tag}vb" up
}

# netns_pair_begin PREFIX OCTET: the whole set-up of a two-host test. Exits $skip (saying why)
# without root or ip; sets tag (PREFIX and this shell's pid), ns_a, ns_b, net (10.OCTET.x),
# addr_a ($net.1), addr_b ($net.2) and out (a scratch folder); makes the pair; on exit, also
# by SIGTERM, SIGINT or SIGHUP (a timeout's), ends what is left in either namespace (by pid:
# only ours live there) and this shell's jobs, deletes both and out.
netns_pair_begin() {
  if [ "$(id -u)" != 0 ] || ! command -v ip > /dev/null; then
    echo "SKIPPED: needs root and ip (iproute2) to make network namespaces" >&2
    exit "$skip"
  fi
  tag=$1$$
  ns_a=${tag}a ns_b=${tag}b
  net=10.$2.$(($$ % 250))
  addr_a=$net.1 addr_b=$net.2
  out=$(mktemp -d)
  trap netns_pair_end EXIT
  # A signal ends the script through its EXIT trap, saying so, rather than leaving the
  # namespaces and their processes behind.
  trap 'netns_pair_signal TERM 143' TERM
  trap 'netns_pair_signal INT 130' INT
  trap 'netns_pair_signal HUP 129' HUP
  make_netns_pair
}

netns_pair_signal() {
  echo "FAILED: interrupted by SIG$1; cleaning up the namespaces $ns_a and $ns_b" >&2
  exit "$2"
}

# left: the processes still in either namespace.
netns_pair_left() {
  left=$(echo $(ip netns pids "$ns_a" 2> /dev/null) $(ip netns pids "$ns_b" 2> /dev/null))
}

netns_pair_end() {
  local ns pid left
  trap - TERM INT HUP
  # SIGTERM first (SIGCONT for a stopped one) to what runs in the namespaces: a launcher then
  # stops and reaps its workers, and each process is reaped by its parent, not orphaned for PID
  # 1 (which may be slow to reap); SIGKILL what outlives 5 s. This shell's jobs (read here: a
  # pipeline's subshell has none) end with their children; what is left of them is killed.
  netns_pair_left
  for pid in $left; do kill -TERM "$pid" 2> /dev/null && kill -CONT "$pid" 2> /dev/null; done
  for _ in $(seq 50); do
    [ -n "$left" ] || break
    sleep 0.1
    netns_pair_left
  done
  for pid in $left; do kill -KILL "$pid" 2> /dev/null; done
  for _ in $(seq 10); do
    [ -n "$(jobs -pr)" ] || break
    sleep 0.1
  done
  for pid in $(jobs -pr); do kill -KILL "$pid" 2> /dev/null; done
  wait 2> /dev/null
  for ns in "$ns_a" "$ns_b"; do
    ip netns del "$ns" 2> /dev/null || true
  done
  rm -rf "$out"
}
