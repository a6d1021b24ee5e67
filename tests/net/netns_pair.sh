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
# addr_a ($net.1), addr_b ($net.2) and out (a scratch folder); makes the pair; on exit kills
# what is left in either namespace (by pid: only ours live there), deletes both and out.
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
  make_netns_pair
}

netns_pair_end() {
  local ns pid
  for ns in "$ns_a" "$ns_b"; do
    for pid in $(ip netns pids "$ns" 2> /dev/null); do kill -KILL "$pid" 2> /dev/null; done
    ip netns del "$ns" 2> /dev/null || true
  done
  rm -rf "$out"
}
