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
