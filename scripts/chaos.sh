#!/usr/bin/env bash
# Chaos run: SIGKILLs random workers of a dp2 x pp2 x tp2 ZeRO-1 job with asynchronous saves at
# random times; the job restarts from its checkpoints and must end bitwise an uninterrupted run.
# usage: scripts/chaos.sh [--seed S] [--kills N] [--steps N] [--meshtrain PATH] [--keep-dir]
#   --seed S      the RNG seed of the kills' times and victims (default: from the clock, printed)
#   --kills N     how many workers to kill, one per attempt (default 3)
#   --steps N     the job's optimizer steps (default 10 per kill, at least 30)
#   --meshtrain   the binary (default build/meshtrain next to this script)
#   --keep-dir    keep the work folder (also kept on FAIL)
# Prints one line per kill and PASS or FAIL with the kills done; exit 0 on PASS, 1 on FAIL,
# 2 on bad arguments.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
seed=$(( $(date +%s%N) % 1000000 ))
kills=3
steps=
meshtrain="$here/../build/meshtrain"
keep_dir=0
usage() { sed -n '4,10p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
number() { [[ $2 =~ ^[0-9]+$ ]] || { echo "chaos.sh: $1 needs a number, not '$2'" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
  case $1 in
    --seed) [ $# -ge 2 ] || usage; number "$1" "$2"; seed=$2; shift 2 ;;
    --kills) [ $# -ge 2 ] || usage; number "$1" "$2"; kills=$2; shift 2 ;;
    --steps) [ $# -ge 2 ] || usage; number "$1" "$2"; steps=$2; shift 2 ;;
    --meshtrain) [ $# -ge 2 ] || usage; meshtrain=$2; shift 2 ;;
    --keep-dir) keep_dir=1; shift ;;
    -h|--help) usage ;;
    *) echo "chaos.sh: unknown argument '$1'" >&2; usage ;;
  esac
done
[ -x "$meshtrain" ] || { echo "chaos.sh: '$meshtrain' is not an executable (build first)" >&2; exit 2; }
[ -n "$steps" ] || steps=$(( kills * 10 > 30 ? kills * 10 : 30 ))
[ "$steps" -ge 2 ] || { echo "chaos.sh: --steps must be at least 2" >&2; exit 2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/chaos.XXXXXX")
launcher=
cleanup() {
  local rc=$?
  # only the job this script started, by its pid (its workers die with it: PDEATHSIG)
  [ -n "$launcher" ] && kill -KILL "$launcher" 2>/dev/null || true
  if [ $rc -eq 0 ] && [ $keep_dir = 0 ]; then rm -rf "$work"; else echo "chaos.sh: work folder kept: $work"; fi
}
trap cleanup EXIT
# the flight recorder dumps of the failed attempts stay in the work folder
export TMPDIR="$work/tmp"
mkdir -p "$TMPDIR"
RANDOM=$seed
# draw BELOW: a number in [0, BELOW) from the seeded generator into $drawn (no subshell, so
# the sequence is the seed's)
draw() { drawn=$(( ((RANDOM << 15) | RANDOM) % $1 )); }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

# The corpus: this repository's architecture notes as byte tokens (any text would do).
"$meshtrain" data text "$here/../docs/architecture.md" --out "$work/data" > /dev/null
# A tiny GPT on 8 ranks: 2 replicas x 2 stages x 2 tensor-parallel ranks, ZeRO-1, asynchronous
# saves every 2 steps (the newest 3 kept).
job=(--data "$work/data" --vocab 256 --context 16 --layers 2 --heads 2 --width 32 --batch 8
     --microbatches 2 --steps "$steps" --warmup 2 --eval_every 10 --eval_seqs 8
     --sample_tokens 0 --threads 1 --nproc 8 --dp 2 --pp 2 --tp 2 --zero 1
     --save_every 2 --keep 3 --async_save on)

# children PID: the live (not yet reaped) children of PID, one a line
children() { ps -o pid=,stat= --ppid "$1" 2>/dev/null | awk '$2 !~ /^Z/ {print $1}' || true; }

# The reference, uninterrupted; its start-up (until the first step is logged) and whole time
# set the range of the kills' times.
echo "chaos: seed $seed, $kills kills, $steps steps, work folder $work"
start=$(now_ms)
"$meshtrain" train "${job[@]}" --out "$work/ref" > "$work/ref.log" 2>&1 &
launcher=$!
startup=
while kill -0 "$launcher" 2>/dev/null; do
  if [ -z "$startup" ] && [ -s "$work/ref/metrics.jsonl" ]; then startup=$(( $(now_ms) - start )); fi
  sleep 0.02
done
wait "$launcher" || { launcher=; tail -n 20 "$work/ref.log"; echo "FAIL: the reference run failed"; exit 1; }
launcher=
total=$(( $(now_ms) - start ))
startup=${startup:-$total}
echo "chaos: reference run ${total} ms (start-up ${startup} ms)"

# The chaos run, under enough restarts for every kill.
"$meshtrain" train "${job[@]}" --max-restarts $(( kills + 2 )) --out "$work/chaos" \
  > "$work/chaos.log" 2>&1 &
launcher=$!
start=$(now_ms)
done_kills=0
killed=()    # the pid of each kill
seen=()      # every worker pid seen, for the stray-process check
finished_early=0
# wait_attempt OLD...: waits for 8 live workers none of which is in OLD; prints them. Returns
# 1 when the launcher ended first, 2 after 120 s.
wait_attempt() {
  local deadline=$(( $(now_ms) + 120000 )) pids
  while kill -0 "$launcher" 2>/dev/null; do
    pids=$(children "$launcher")
    if [ "$(echo "$pids" | grep -c .)" -eq 8 ]; then
      local fresh=1 p
      for p in $pids; do [[ " $* " == *" $p "* ]] && fresh=0; done
      [ $fresh = 1 ] && { echo "$pids"; return 0; }
    fi
    [ "$(now_ms)" -lt $deadline ] || return 2
    sleep 0.01
  done
  return 1
}
# newest_step: the newest committed checkpoint's step (0: none), which an attempt resumes
newest_step() {
  ls "$work/chaos/ckpt" 2>/dev/null | sed -n 's/^step_\([0-9]*\)$/\1/p' | sort -n | tail -n 1 |
    grep . || echo 0
}
# logged_step: the last step in the attempt's metrics.jsonl (0 until the attempt wrote it:
# before that it holds the steps of the previous attempt, trimmed at the resume)
logged_step() {
  local m="$work/chaos/metrics.jsonl"
  [ "$m" -nt "$work/attempt" ] || { echo 0; return; }
  tail -n 1 "$m" | sed -n 's/^{"step": \([0-9]*\),.*/\1/p' | grep . || echo 0
}
# Each kill lands, one time in four, in the attempt's start-up (a time drawn below the
# reference's), else in its training: after a step drawn from those left (each kill's share of
# them: the kill lands some steps later still, as the log is polled) plus up to 100 ms more.
previous=()
for ((k = 1; k <= kills; k++)); do
  rc=0; pids=$(wait_attempt "${previous[@]}") || rc=$?
  [ $rc = 2 ] && { echo "FAIL: attempt $k never started its 8 workers (120 s)"; exit 1; }
  [ $rc = 1 ] && { echo "chaos: the job ended before attempt $k started"; finished_early=1; break; }
  touch "$work/attempt"
  mapfile -t previous <<< "$pids"
  seen+=("${previous[@]}")
  resume=$(newest_step)
  left=$(( steps - 1 - resume )); [ $left -ge 1 ] || left=1
  share=$(( left / (kills - k + 2) )); [ $share -ge 1 ] || share=1
  draw 4
  if [ $drawn = 0 ]; then
    draw "$startup"; when="${drawn} ms into the start-up"
    sleep "$(printf '%d.%03d' $((drawn / 1000)) $((drawn % 1000)))"
  else
    draw "$share"; target=$(( resume + 1 + drawn ))
    draw 100; when="${drawn} ms after step $target was logged"
    deadline=$(( $(now_ms) + 120000 ))
    while [ "$(logged_step)" -lt $target ] && kill -0 "$launcher" 2>/dev/null; do
      [ "$(now_ms)" -lt $deadline ] || { echo "FAIL: attempt $k never reached step $target (120 s)"; exit 1; }
      sleep 0.005
    done
    sleep "0.$(printf '%03d' "$drawn")"
  fi
  draw 8; victim=${previous[$drawn]}
  # a worker that already exited (a zombie not yet reaped) would take the signal unharmed
  state=$(awk '{print $3}' "/proc/$victim/stat" 2>/dev/null || echo gone)
  if [ "$state" = Z ] || [ "$state" = gone ] || ! kill -KILL "$victim" 2>/dev/null; then
    # it ended on its own (the job finished, or the attempt failed by itself)
    kill -0 "$launcher" 2>/dev/null || { echo "chaos: the job ended before kill $k"; finished_early=1; break; }
    echo "chaos: kill $k: pid $victim had already ended; trying again"
    k=$((k - 1))
    continue
  fi
  done_kills=$k
  killed+=("$victim")
  echo "chaos: kill $k: SIGKILL pid $victim, $when (resumed from step $resume)"
done
rc=0
timeout 300 tail --pid="$launcher" -f /dev/null || true
if kill -0 "$launcher" 2>/dev/null; then
  echo "FAIL: the job did not end within 300 s of the last kill"
  exit 1
fi
wait "$launcher" || rc=$?
launcher=
elapsed=$(( $(now_ms) - start ))

problems=()
[ $rc = 0 ] || problems+=("the chaos run exited $rc: $(grep -v '^\[' "$work/chaos.log" | tail -n 3 | tr '\n' ' ')")
# A worker already inside its exit when the last kill lands takes the signal unharmed and ends
# with its own status: the job then finishes with no restart for that kill, which is not a
# failure of the job (every earlier kill restarted it).
restarts=$(grep -c 'restarting the job' "$work/chaos.log" || true)
if [ $rc = 0 ] && [ $done_kills -ge 1 ] && [ "$restarts" = $((done_kills - 1)) ] &&
   ! grep -Eq "\(pid ${killed[-1]} on host .*\) was killed by signal 9" "$work/chaos.log"; then
  echo "chaos: kill $done_kills landed on pid ${killed[-1]} as it was exiting; the job finished"
  unset 'killed[-1]'
  done_kills=$((done_kills - 1))
  finished_early=1
fi
# the launcher named each killed worker (not a peer that exited after losing it)
for entry in "${killed[@]}"; do
  pid=$entry
  grep -Eq "rank [0-9]+ \(pid $pid on host .*\) was killed by signal 9" "$work/chaos.log" ||
    problems+=("the launcher did not name pid $pid as killed by signal 9: $(grep -E 'exited with code|killed by signal' "$work/chaos.log" | grep -v '^\[' | tail -n 1)")
done
# the same training, bitwise: the model, the last checkpoint's shards, the logged figures
if [ $rc = 0 ]; then
  cmp -s "$work/ref/model.safetensors" "$work/chaos/model.safetensors" ||
    problems+=("model.safetensors differs from the uninterrupted run's")
  for shard in "$work/ref/ckpt/step_$steps"/rank*.shard; do
    cmp -s "$shard" "$work/chaos/ckpt/step_$steps/${shard##*/}" ||
      problems+=("ckpt/step_$steps/${shard##*/} differs from the uninterrupted run's")
  done
  # the logged figures without what timing decides (speed, data wait, the step accounting)
  untimed="$here/untimed_metrics.sh"
  cmp -s <("$untimed" "$work/ref/metrics.jsonl") <("$untimed" "$work/chaos/metrics.jsonl") ||
    problems+=("metrics.jsonl (losses, gradient norms) differs from the uninterrupted run's")
fi
# nothing left behind: no hidden folder of a killed save or prune, no more than --keep
# checkpoints, no worker process
leftovers=$(ls -A "$work/chaos/ckpt" 2>/dev/null | grep -v '^step_[0-9]*$' | tr '\n' ' ' || true)
[ -z "$leftovers" ] || problems+=("left in ckpt/: $leftovers")
count=$(ls "$work/chaos/ckpt" 2>/dev/null | grep -c '^step_' || true)
[ "$count" -le 3 ] || problems+=("$count checkpoints kept, more than --keep 3")
for pid in "${seen[@]}"; do
  [ -d "/proc/$pid" ] && grep -qa -- "$work" "/proc/$pid/cmdline" 2>/dev/null &&
    problems+=("worker pid $pid outlived the job")
done

summary="$done_kills of $kills kills, $restarts restarts, ${elapsed} ms, seed $seed"
[ $finished_early = 1 ] && summary+="; the job finished before kill $((done_kills + 1))"
if [ ${#problems[@]} -eq 0 ]; then
  echo "PASS: $summary; final model, checkpoint and metrics bitwise the uninterrupted run's"
  exit 0
fi
echo "FAIL: $summary"
printf '  %s\n' "${problems[@]}"
exit 1
