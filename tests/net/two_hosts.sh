#!/usr/bin/env bash
# examples/two-hosts.md as written, across two "hosts": two network namespaces joined by a
# veth pair, each with its own folder and /dev/shm. Its `sh host-a` and `sh host-b` blocks run
# with only the addresses (10.0.0.1, 10.0.0.2) and build/meshtrain put in place, the train
# lines made tiny; the secret goes from host A to host B as the page says (cp -p for scp -p).
# The check job must pass and the train job write its summary on host A, with the ranks of both
# namespaces dividing the one machine's CPUs. The README's two-host lines must be the page's.
# Each host is bounded by host_seconds, well under ctest's TIMEOUT (60 s), so a hang is this
# script's failure, with both hosts' logs, and its trap (netns_pair.sh) leaves nothing behind.
# Needs root (ip netns, mount). Usage: two_hosts.sh MESHTRAIN SOURCE_DIR   (about 1 s)
set -uo pipefail
mt=$1
src=$2
page=$src/examples/two-hosts.md
skip=77 # ctest's SKIP_RETURN_CODE for this test
# Both of a host's jobs (about 1 s) within this; SIGKILL 8 s later (a launcher stops its workers
# within 5 s of a SIGTERM, its grace and theirs). With the set-up and the clean-up (at most 5 s)
# that is under ctest's 60 s.
host_seconds=35

fail() {
  echo "FAILED: $*" >&2
  exit 1
}

# The README's two-host commands are the page's (checked before anything needs root).
grep -qF "examples/two-hosts.md" "$src/README.md" || fail "README does not point to examples/two-hosts.md"
readme_lines=$(grep -F -- "launch --nnodes 2 --node-rank" "$src/README.md")
[ -n "$readme_lines" ] || fail "README has no two-host launch lines"
while IFS= read -r line; do
  grep -qxF -- "$line" "$page" || fail "README's line is not in $page: $line"
done <<< "$readme_lines"
grep -qF "export MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 MT_COMM_BACKEND=hier" "$src/README.md" ||
  fail "README lacks the page's MASTER_ADDR, MASTER_PORT and MT_COMM_BACKEND line"
echo "  ok: README's two-host lines are the page's"

. "$(dirname "$0")/netns_pair.sh"
netns_pair_begin mth 215

# blocks TAG: the page's ```sh TAG blocks, in order, each ended by a line "#--".
blocks() {
  awk -v tag="$1" '$0 == "```sh " tag { on = 1; next }
                   on && $0 == "```" { on = 0; print "#--"; next }
                   on { print }' "$page"
}
# The page's commands for this test: its addresses and meshtrain, a tiny training run.
localise() {
  sed -e "s/10\.0\.0\.1/$addr_a/g" -e "s/10\.0\.0\.2/$addr_b/g" -e "s#build/meshtrain#$mt#g" \
      -e "/ train --config/s#\$# --data $out/corpus --steps 2 --layers 1 --width 16 --heads 2 --context 8 --batch 8 --sample_tokens 0 --eval_every 0#"
}
blocks host-a | localise > "$out/a.all"
blocks host-b | localise > "$out/b.all"
# Host A's first block makes the secret; the rest of A and all of B run at once.
awk '/^#--$/ { exit } { print }' "$out/a.all" > "$out/a.secret"
awk 'seen { print } /^#--$/ { seen = 1 }' "$out/a.all" > "$out/a.rest"
cp "$out/b.all" "$out/b.rest"
grep -q "job.secret" "$out/a.secret" || fail "the page's first host-a block does not make job.secret"
grep -q "node-rank 0 .* check" "$out/a.rest" && grep -q "node-rank 1 .* check" "$out/b.rest" &&
  grep -q "node-rank 1 .* train" "$out/b.rest" || fail "the page lacks a check and a train on both hosts"

for i in $(seq 200); do echo "And the evening and the morning were day $i of the tiny corpus."; done \
  > "$out/text.txt"
"$mt" data text "$out/text.txt" --out "$out/corpus" > /dev/null || fail "meshtrain data text"
mkdir -p "$out/hostA" "$out/hostB"
for d in "$out/hostA" "$out/hostB"; do ln -s "$src/configs" "$d/configs"; done

# host NS DIR SCRIPT: runs SCRIPT (set -e: the first failing command ends it) in namespace NS,
# in DIR, with a private /dev/shm as a host of its own has; bounded by host_seconds (exit 124,
# or 137 when SIGTERM was not enough). The timeout's SIGTERM reaches the launcher too, which
# stops and reaps its workers; the shell waits for it (its trap runs after), so no orphan is
# left for PID 1 to reap.
host() {
  ip netns exec "$1" env MT_COMM_TIMEOUT=10 MT_COMM_HOST_IDENTITY=netns \
    timeout -k 8 "$host_seconds" bash -c 'trap "exit 143" TERM INT
                             mount -t tmpfs -o mode=1777 mt-two-hosts /dev/shm || exit 90
                             cd "$1" && set -e && . "$2"' host "$2" "$3"
}
(cd "$out/hostA" && bash -e "$out/a.secret") || fail "host A: making the secret"
[ "$(stat -c %a "$out/hostA/job.secret")" = 600 ] || fail "job.secret is not mode 600"
cp -p "$out/hostA/job.secret" "$out/hostB/job.secret"

host "$ns_a" "$out/hostA" "$out/a.rest" > "$out/a.log" 2>&1 &
pid_a=$!
host "$ns_b" "$out/hostB" "$out/b.rest" > "$out/b.log" 2>&1 &
pid_b=$!
wait $pid_a
rc_a=$?
wait $pid_b
rc_b=$?
# exit CODE: how a host's commands ended, a timeout named as one.
ended() {
  case $1 in
  124 | 137) echo "no end within $host_seconds s (killed by timeout: hung?)" ;;
  *) echo "exit $1" ;;
  esac
}
if [ $rc_a != 0 ] || [ $rc_b != 0 ]; then
  sed 's/^/    [host A] /' "$out/a.log"
  sed 's/^/    [host B] /' "$out/b.log"
  fail "the page's commands: host A $(ended $rc_a), host B $(ended $rc_b)"
fi
checked=$(cat "$out/a.log" "$out/b.log" | grep -c "^\[[0-3]\] rank [0-3] of 4 .*correct")
[ "$checked" = 4 ] || fail "meshtrain check: $checked of 4 ranks said they were correct"
echo "  ok: meshtrain check across the two hosts"
summary=$out/hostA/runs/two-hosts/summary.json
[ -f "$summary" ] || fail "no runs/two-hosts/summary.json on host A"
[ ! -e "$out/hostB/runs/two-hosts/summary.json" ] || fail "host B wrote a summary too"
grep -qF '"dp": 4,' "$summary" || fail "the run is not dp 4: $(cat "$summary")"
# Both namespaces run on one kernel: the 4 ranks share its CPUs, whatever network they see.
grep -qF '"threads_source": "affinity/4 local ranks"' "$summary" ||
  fail "the ranks of both namespaces do not share the CPUs: $(cat "$summary")"
echo "  ok: train across the two hosts, summary on host A, the CPUs shared by 4 ranks"
