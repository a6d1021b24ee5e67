#!/usr/bin/env bash
# scripts/slow_net.sh builds its hosts and leaves nothing behind: two invocations at once (a
# 2-host `meshtrain check` through the rate-limited bridge, and a 3-host job ended by SIGTERM
# while it runs) never collide, each succeeds or stops as asked, and afterwards no namespace of
# either is left. Needs root (ip netns, tc). Usage: slow_net.sh MESHTRAIN SOURCE_DIR (about 5 s)
set -uo pipefail
mt=$1
script=$2/scripts/slow_net.sh
skip=77
if [ "$(id -u)" != 0 ] || ! command -v ip > /dev/null || ! command -v tc > /dev/null; then
  echo "SKIPPED: needs root and iproute2 (ip, tc) to make network namespaces" >&2
  exit $skip
fi
out=$(mktemp -d)
pids=()
finish() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2> /dev/null; done
  wait 2> /dev/null
  rm -rf "$out"
}
trap finish EXIT
fail() {
  echo "FAILED: $*" >&2
  for f in "$out"/*.log; do [ -f "$f" ] && sed "s|^|    [$(basename "$f")] |" "$f" >&2; done
  exit 1
}
# namespaces TAG: how many namespaces of the invocation tagged TAG (its switch, its hosts) exist.
namespaces() { ip netns list | awk '{print $1}' | grep -Ec "^$1(sw|h[0-9]+)\$" || true; }

# A job that runs until it is stopped: its namespaces must go with it.
bash "$script" --hosts 3 --timeout 60 "$mt" -- sleep 50 > "$out/held.log" 2>&1 &
held=$!
pids+=($held)
bash "$script" --hosts 2 --nproc 2 --rate 50mbit --timeout 60 "$mt" -- "$mt" check \
  > "$out/check.log" 2>&1 &
check=$!
pids+=($check)
for _ in $(seq 200); do
  [ "$(namespaces "sn${held}")" = 4 ] && [ "$(ip netns pids "sn${held}h2" 2> /dev/null)" ] && break
  sleep 0.1
done
[ "$(namespaces "sn${held}")" = 4 ] || fail "the held job did not make its switch and 3 hosts"
echo "  ok: a 3-host job up (switch and 3 hosts) alongside a 2-host one"
wait $check
rc=$?
[ $rc = 0 ] || fail "the 2-host check through slow_net.sh exited $rc"
n=$(grep -c "rank [0-3] of 4 .*correct" "$out/check.log")
[ "$n" -ge 1 ] || fail "meshtrain check said nothing correct on host 0"
[ "$(namespaces "sn${check}")" = 0 ] || fail "the check's namespaces are left: $(ip netns list | grep "sn${check}")"
echo "  ok: meshtrain check on 2 hosts x 2 ranks at 50mbit; its namespaces gone"
kill -TERM $held
start=$SECONDS
wait $held
rc=$?
[ $rc != 0 ] || fail "the held job ended 0 after SIGTERM"
[ "$(namespaces "sn${held}")" = 0 ] || fail "SIGTERM left namespaces: $(ip netns list | grep "sn${held}")"
echo "  ok: SIGTERM ends the held job (exit $rc, $((SECONDS - start)) s) and removes its namespaces"
