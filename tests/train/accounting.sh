#!/usr/bin/env bash
# ctest train_accounting: the step accounting and the verdict against injected ground truth.
# slow_comm on rank 1 raises rank 1's exposed dp communication by the injected time (within 2
# points of the step's share); slow_compute on rank 1 makes the verdict name rank 1 the
# straggler; a pp 4 run with as many micro-batches as stages is pipeline-bound, its measured
# bubble within 3 points of the schedule replayed (`meshtrain bench schedule`) with the run's
# own per-stage pass times,
# and its traces are merged at the end and drawn by `meshtrain report` as 4 lanes; --overlap on
# hides part of the dp reductions behind backward where off hides none; a rank's log from a host
# that does not share OUT reaches rank 0's OUT/logs.
# usage: accounting.sh MESHTRAIN
set -uo pipefail
meshtrain=$1
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
export TMPDIR=$scratch
bible -f gen1:1-gen3:24 >"$scratch/text.txt"
"$meshtrain" data text "$scratch/text.txt" --out "$scratch/data" >/dev/null || exit 1
job=(--data "$scratch/data" --vocab 256 --context 16 --layers 2 --heads 2 --width 32 --batch 8
     --microbatches 1 --steps 6 --warmup 1 --eval_every 0 --sample_tokens 0 --threads 1
     --log_every 3)
failed=0
fail() { echo "FAIL $1"; failed=1; }

# run NAME FAULT ARGS...: trains into $scratch/NAME under the fault.
run() {
  local name=$1 fault=$2
  shift 2
  if ! MT_INJECT_FAULT=$fault timeout 120 "$meshtrain" train "${job[@]}" --out "$scratch/$name" \
       "$@" >"$scratch/$name.log" 2>&1; then
    fail "$name: the run failed"
    cat "$scratch/$name.log"
    return 1
  fi
}

# Rank 1 sleeps MS before (blocking) or when waiting for (non-blocking) each operation on its
# world and groups: n operations a step inject n x MS, all of it exposed dp communication (no
# pipeline, no tp, no evaluation). Its step and its exposed dp rise together (within 2 points
# of the step), by the injected time less the waits for rank 0 that the clean run had and the
# slow one no longer has (rank 0 now waits for rank 1).
ms=40
run clean "" --nproc 2 && run comm "slow_comm@1:$ms" --nproc 2 && {
  /usr/bin/python3 - "$scratch/clean" "$scratch/comm" "$ms" <<'EOF' || fail "slow_comm: exposed dp communication"
import json, sys
def rank1(out):
    return json.load(open(f"{out}/summary.json"))["accounting"]["ranks"][1]
clean, slow, ms = rank1(sys.argv[1]), rank1(sys.argv[2]), float(sys.argv[3])
wall = slow["wall_ms"]
rise, step_rise = slow["dp"] - clean["dp"], wall - clean["wall_ms"]
n = round((step_rise + clean["dp"]) / ms)
injected = n * ms
gap = abs(rise - step_rise) / wall
ok = n >= 1 and gap <= 0.02 and injected - clean["dp"] - 0.02 * wall <= rise <= injected + 0.02 * wall
print(f"{'ok  ' if ok else 'FAIL'} slow_comm@1:{ms:g}: {n} operations x {ms:g} ms injected per "
      f"step; rank 1's exposed dp rose {rise:.1f} ms, its step {step_rise:.1f} ms ({100 * gap:.1f} "
      f"points of its {wall:.1f} ms step apart; its clean run waited {clean['dp']:.1f} ms on dp)")
sys.exit(0 if ok else 1)
EOF
}

run compute "slow_compute@1:30" --nproc 2 && {
  grep -q "verdict: straggler: rank 1 " "$scratch/compute.log" &&
    grep -q '"kind": "straggler", "text": "straggler: rank 1 ' "$scratch/compute/summary.json" &&
    echo "ok   slow_compute@1:30: $(grep -o 'straggler: rank 1 [^;]*' "$scratch/compute.log")" ||
    fail "slow_compute@1:30: rank 1 is not named the straggler: $(grep verdict "$scratch/compute.log")"
  grep -q "verdict: straggler: rank 0 " "$scratch/compute.log" && fail "rank 0 named a straggler"
}

# --overlap on against off: with buckets small enough that backward fills several, on hides part
# of the data-parallel reductions behind backward; off starts them all once backward ends, so
# none can hide, however late the rank comes to wait for each (a busy machine delays it).
# Losses agree.
overlap_job=(--nproc 2 --context 64 --layers 4 --heads 4 --width 128 --steps 8 --log_every 4
             --bucket_mb 0.25)
run overlap_on "" "${overlap_job[@]}" --overlap on &&
  run overlap_off "" "${overlap_job[@]}" --overlap off && {
  /usr/bin/python3 - "$scratch/overlap_on" "$scratch/overlap_off" <<'EOF' || fail "--overlap on/off: dp_overlap"
import json, sys
def spread(out):
    return json.load(open(f"{out}/summary.json"))["accounting"]["dp_overlap"]
def losses(out):
    return [json.loads(l)["loss"] for l in open(f"{out}/metrics.jsonl") if '"loss"' in l]
on, off = spread(sys.argv[1]), spread(sys.argv[2])
same = losses(sys.argv[1]) == losses(sys.argv[2])
ok = off[2] == 0 and on[1] >= off[1] + 0.2 and same
print(f"{'ok  ' if ok else 'FAIL'} dp_overlap [min, median, max] with --overlap on "
      f"{[round(x, 3) for x in on]}, off {[round(x, 3) for x in off]}; losses "
      f"{'equal' if same else 'differ'}")
sys.exit(0 if ok else 1)
EOF
}

# Two launchers of one worker each, node 1 in a mount namespace of its own whose OUT is a
# private tmpfs (a host without the shared folder): at the end, rank 0 fetches rank 1's log
# into its OUT/logs, byte for byte the one node 1 wrote, and its trace into the merged one.
if unshare -m true 2>/dev/null; then
  shared="$scratch/unshared" port=$((12000 + ($$ + 7) % 15000))
  mkdir -p "$shared"
  (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$scratch/secret")
  launch=(launch --master "127.0.0.1:$port" --secret-file "$scratch/secret" --nnodes 2
          --nproc-per-node 1 --join-timeout 30)
  train=(train "${job[@]}" --out "$shared/out" --trace "$shared/out/trace.json")
  timeout 120 "$meshtrain" "${launch[@]}" --node-rank 0 -- "$meshtrain" "${train[@]}" \
    >"$scratch/node0.log" 2>&1 &
  node0=$!
  timeout 120 unshare -m sh -c 'mount -t tmpfs tmpfs "$1" && shift && "$@" &&
    cp "$0/out/logs/rank1.log" "$0.rank1.log"' "$shared" "$shared" "$meshtrain" "${launch[@]}" \
    --node-rank 1 -- "$meshtrain" "${train[@]}" >"$scratch/node1.log" 2>&1 || fail "node 1 failed:
$(tail -n 5 "$scratch/node1.log")"
  wait "$node0" || fail "node 0 failed: $(tail -n 5 "$scratch/node0.log")"
  if cmp -s "$shared.rank1.log" "$shared/out/logs/rank1.log" &&
     grep -q "logs: 1 rank log from other hosts collected into" "$scratch/node0.log"; then
    echo "ok   rank 1's log, written on a host without the shared OUT, collected by rank 0: $(head -c 60 "$shared/out/logs/rank1.log" | head -n 1)..."
  else
    fail "rank 1's log not collected into node 0's OUT/logs: $(ls "$shared/out/logs" 2>&1 | tr '\n' ' ')"
  fi
  if grep -q "trace: 2 rank files merged into .* (some fetched from other hosts)" "$scratch/node0.log" &&
     grep -q '"meshtrain":{"ranks":2,"version":1}}$' "$shared/out/trace.json"; then
    echo "ok   rank 1's trace fetched from its host and merged: 2 ranks in trace.json"
  else
    fail "rank 1's trace not merged on node 0: $(grep trace: "$scratch/node0.log")"
  fi
else
  echo "skip log collection: no mount namespace here (unshare -m needs root)"
fi

# pp 4 with 4 micro-batches (gpipe idles 3 of each stage's 7 pass slots), each forward a 40 ms
# sleep on every rank: passes that wait off the CPU (as a device's kernels would) let 4 ranks
# share 2 cores without slowing each other, so the schedule's idle time is what the stages
# measure (with CPU-bound passes, the computing ranks take the cores from one another and the
# measured bubble here was 74% against 48% replayed).
run pp "sleep_compute@all:40" --nproc 4 --pp 4 --microbatches 4 --layers 4 --schedule gpipe \
  --trace "$scratch/pp/trace.json" && {
  # the ranks' traces merged into the one asked for, and the report's timeline of a lane each
  "$meshtrain" report "$scratch/pp" >"$scratch/report.log" 2>&1 &&
    grep -q '"meshtrain":{"ranks":4,"version":1}}$' "$scratch/pp/trace.json" &&
    grep -q "trace: 4 rank files merged into" "$scratch/pp.log" &&
    grep -qE '<svg class="plot timeline" data-lanes="4" data-points="0*[1-9][0-9]*"' "$scratch/pp/report.html" &&
    echo "ok   pp 4 traces merged into trace.json; the report's timeline has 4 lanes" ||
    fail "pp 4 trace merge or timeline: $(tail -n 2 "$scratch/pp.log") $(cat "$scratch/report.log")"
  per_stage=$(/usr/bin/python3 -c 'import json, sys
ranks = json.load(open(sys.argv[1]))["accounting"]["ranks"]
print(",".join("%.6f" % (r["forward"] / 4e3) for r in ranks),
      ",".join("%.6f" % (r["backward"] / 4e3) for r in ranks))' "$scratch/pp/summary.json")
  read -r forward backward <<<"$per_stage"
  "$meshtrain" bench schedule --pp 4 --microbatches 4 --schedule gpipe --forward "$forward" \
    --backward "$backward" >"$scratch/replay.txt" || fail "bench schedule failed"
  /usr/bin/python3 - "$scratch/pp/summary.json" "$scratch/replay.txt" <<'EOF' || fail "pp 4: verdict or bubble"
import json, re, sys
summary = json.load(open(sys.argv[1]))
replayed = [float(x) / 100 for x in re.findall(r"^\s+\d+\s+([\d.]+)%", open(sys.argv[2]).read(), re.M)]
measured, replay = sum(summary["bubble"]) / 4, sum(replayed) / len(replayed)
ok = summary["verdict"]["bound"] == "pipeline" and abs(measured - replay) <= 0.03
print(f"{'ok  ' if ok else 'FAIL'} pp 4, 4 micro-batches: bound {summary['verdict']['bound']}, "
      f"measured bubble {100 * measured:.1f}%, replayed with the run's pass times "
      f"{100 * replay:.1f}%, textbook {100 * summary['bubble_expected']:.1f}%")
sys.exit(0 if ok else 1)
EOF
}
exit $failed
