#!/usr/bin/env bash
# meshtrain under a real Slurm (a private cluster on this host, tests/slurm/slurm_cluster.sh):
# the example batch scripts train what `meshtrain train --nproc` trains, srun -n 8 on a 3D mesh
# too, scancel stops every rank and the job resumes from its last checkpoint, a rank killed
# under srun makes the others fail (naming it) well within the communicator's timeout, and
# meshtrain launch inside a batch job restarts it, a stale MASTER_PORT is named in seconds, a
# layout that does not divide the world and a missing secret are one message each. Two slurmd in
# network namespaces carry the multi-node example where this host allows it; elsewhere it runs
# on the one node.
# usage: slurm.sh MESHTRAIN SOURCE_DIR   (exit 77: Slurm is not installed)
set -euo pipefail
meshtrain=$(realpath "$1")
source_dir=$(realpath "$2")
skip=77
source "$source_dir/tests/train/genesis_setup.sh"
source "$here/../train/expect.sh"
source "$here/slurm_cluster.sh"
trap 'slurm_stop; rm -rf "$scratch"' EXIT
trap 'exit 143' TERM INT   # ctest's timeout or Ctrl-C: the daemons and namespaces still go
slurm_start "${MT_TEST_SLURM_MODE:-two}"   # one: a single slurmd
echo "ok   a Slurm cluster of $slurm_nodes node(s) is up"

export MT_JOB_SECRET=slurm-test-secret-0123456789
export MESHTRAIN=$meshtrain
# A tiny model: every run here takes a second or two. --threads 1: 8 ranks share 2 cores.
job=(--data "$scratch/data" --vocab 256 --context 16 --layers 2 --heads 4 --width 32 --batch 16
     --steps 10 --warmup 2 --lr 3e-3 --eval_every 5 --eval_seqs 8 --sample_tokens 8
     --threads 1)
examples="$source_dir/examples/slurm"

# same_training A B: bitwise the same losses, norms, validation losses and final model.
same_training() {
  cmp -s "$1/model.safetensors" "$2/model.safetensors" &&
    cmp -s <("$untimed" "$1/metrics.jsonl") <("$untimed" "$2/metrics.jsonl")
}

# sbatch_wait NAME [--SBATCH-OPTION VALUE...] SCRIPT ARGS...: submits SCRIPT from the source folder (its configs/ path)
# with RUN_DIR=$scratch/NAME, waits for it, output in $scratch/NAME.out, its id in NAME.jobid.
sbatch_wait() {
  local name=$1 options=(); shift
  while [ "${1#--}" != "$1" ]; do options+=("$1" "$2"); shift 2; done
  local script=$1; shift
  RUN_DIR="$scratch/$name" timeout 120 sbatch --wait --parsable --chdir "$source_dir" \
    --output "$scratch/$name.out" "${options[@]}" "$script" "$@" > "$scratch/$name.jobid"
}

# --- train.sbatch: srun meshtrain train, dp 2 x tp 2, checkpoints -------------------------
# The example's config file sets the rest; the job's options override it in both runs.
timeout 120 "$meshtrain" train --config "$source_dir/configs/default.ini" --nproc 4 --dp 2 --tp 2 \
  --out "$scratch/ref_dp2tp2" "${job[@]}" --save_every 5 > "$scratch/ref_dp2tp2.log" 2>&1 ||
  { fail "the reference run failed"; tail -n 20 "$scratch/ref_dp2tp2.log"; }
if sbatch_wait sbatch_dp2tp2 "$examples/train.sbatch" "${job[@]}" --save_every 5; then
  if same_training "$scratch/ref_dp2tp2" "$scratch/sbatch_dp2tp2" &&
     [ -f "$scratch/sbatch_dp2tp2/ckpt/step_10/metadata.json" ]; then
    echo "ok   train.sbatch: dp 2 x tp 2 under srun is bitwise --nproc 4, checkpoint at step 10"
  else
    fail "train.sbatch trained differently from --nproc 4 (or left no checkpoint)"
  fi
else
  fail "train.sbatch failed"; tail -n 20 "$scratch/sbatch_dp2tp2.out"
fi

# --- srun -n 8 on dp 2 x pp 2 x tp 2 --------------------------------------------------------
mesh=(--dp 2 --pp 2 --tp 2 --microbatches 2)
train_into "$scratch/ref_mesh8" --nproc 8 "${mesh[@]}"
if timeout 120 srun -N 1 -n 8 "$meshtrain" train "${job[@]}" "${mesh[@]}" \
     --out "$scratch/srun_mesh8" > "$scratch/srun_mesh8.log" 2>&1 &&
   same_training "$scratch/ref_mesh8" "$scratch/srun_mesh8"; then
  echo "ok   srun -n 8: dp 2 x pp 2 x tp 2 is bitwise --nproc 8"
else
  fail "srun -n 8 differs from --nproc 8 or failed"; tail -n 20 "$scratch/srun_mesh8.log"
fi

# --- scancel mid-run: every rank ends, the last checkpoint is whole, --resume auto goes on ---
run="$scratch/cancelled"
RUN_DIR="$run" sbatch --chdir "$source_dir" --output "$run.out" --parsable \
  "$examples/train.sbatch" "${job[@]}" --steps 100000 --save_every 5 > "$scratch/jobid"
jobid=$(cut -d';' -f1 "$scratch/jobid")
# newest_saved: the newest step_N in the run's ckpt folder, 0 when none (pruning under --keep
# removes the older ones, so a fast machine may be far past step 15 when it looks).
newest_saved() {
  ls "$run/ckpt" 2> /dev/null | sed -n 's/^step_\([0-9]*\)$/\1/p' | sort -n | tail -n 1 | grep . || echo 0
}
for _ in $(seq 300); do
  [ "$(newest_saved)" -ge 15 ] && break
  sleep 0.1
done
[ "$(newest_saved)" -ge 15 ] || fail "scancel: the job saved no step_15 in 30 s: $(tail -n 5 "$run.out")"
scancel "$jobid"
started=$(date +%s)
ended=
for _ in $(seq 300); do
  if [ -z "$(squeue -h -j "$jobid" 2> /dev/null)" ] && ! pgrep -f -- "--out $run " > /dev/null; then
    ended=$(($(date +%s) - started)); break
  fi
  sleep 0.1
done
if [ -z "$ended" ]; then
  fail "scancel: ranks of job $jobid still run after 30 s: $(pgrep -af -- "--out $run " | head -n 3)"
else
  echo "ok   scancel: job $jobid and every rank gone within ${ended} s"
  newest=$(newest_saved)
  "$meshtrain" ckpt inspect "$run/ckpt/step_$newest" > "$scratch/inspect.log" 2>&1 ||
    fail "scancel: the newest checkpoint step_$newest does not read: $(tail -n 3 "$scratch/inspect.log")"
  if sbatch_wait cancelled "$examples/train.sbatch" "${job[@]}" --steps $((newest + 3)) \
       --save_every 5 &&
     grep -q "resum.*step_$newest" "$run.out" &&
     [ "$(tail -n 1 "$run/metrics.jsonl" | grep -o '"step": [0-9]*')" = "\"step\": $((newest + 3))" ]; then
    echo "ok   scancel: the resubmitted job went on from step_$newest to step $((newest + 3))"
  else
    fail "scancel: --resume auto did not continue from step_$newest"; tail -n 10 "$run.out"
  fi
fi

# --- a rank SIGKILLed under srun: the others fail naming it, srun fails ------------------
kill_log="$scratch/srun_kill.log"
started=$(date +%s)
if MT_INJECT_FAULT=kill@2:4 MT_COMM_TIMEOUT=60 timeout 120 srun -N 1 -n 4 --kill-on-bad-exit=0 \
     "$meshtrain" train "${job[@]}" --steps 50 --dp 2 --tp 2 --out "$scratch/srun_kill" \
     > "$kill_log" 2>&1; then
  fail "srun with a killed rank exited 0"
else
  took=$(($(date +%s) - started))
  # Each survivor ends on the communication layer's error; those sharing a group with rank 2
  # name it (a survivor that only shares a group with a failed survivor names that one).
  failures=$(grep -c "died during" "$kill_log" || true)
  if [ "$took" -lt 60 ] && [ "$failures" -ge 3 ] &&
     grep -Eq "world rank 2, pid [0-9]+\) died|rank 2 \(pid [0-9]+\) died" "$kill_log" &&
     grep -q "task 2: Killed" "$kill_log"; then
    echo "ok   a rank SIGKILLed under srun: the 3 others fail, rank 2 named, srun fails (${took} s)"
  else
    fail "a rank SIGKILLed under srun: $failures of 3 failed on the comm layer in ${took} s"
    cat "$kill_log"
  fi
fi

# --- a stale MASTER_PORT: something listens there and never speaks ----------------------
# A program on rank 0's node holds the port and accepts nothing (the kernel completes
# connections into its backlog): rank 0 cannot host the store there and says so, the other rank
# gives up on the silent listener after a quarter of the timeout and leaves the message to
# rank 0, srun fails.
if [ "$slurm_nodes" = 2 ]; then
  node0=(ip netns exec "${slurm_netns[0]}") where=(-w mtnode1)
  node0_addr=$(ip -n "${slurm_netns[0]}" -4 -o addr show scope global | awk '{print $4}' | cut -d/ -f1)
else
  node0=() where=() node0_addr=$ctld_addr
fi
"${node0[@]}" python3 -c 'import socket, sys, time
s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(8)
print(s.getsockname()[1], flush=True); time.sleep(120)' "$node0_addr" > "$scratch/stale_port" &
stale_pid=$!
for _ in $(seq 50); do [ -s "$scratch/stale_port" ] && break; sleep 0.1; done
started=$(date +%s)
if MASTER_ADDR=$node0_addr MASTER_PORT=$(cat "$scratch/stale_port") MT_COMM_TIMEOUT=8 \
     timeout 60 srun -N 1 -n 2 "${where[@]}" "$meshtrain" train "${job[@]}" --out "$scratch/stale" \
     > "$scratch/stale.log" 2>&1; then
  fail "srun with a stale MASTER_PORT exited 0"
elif [ "$(grep -c "meshtrain train: error:" "$scratch/stale.log")" = 1 ] &&
     grep -q "error:.*$node0_addr:$(cat "$scratch/stale_port").*in use" "$scratch/stale.log"; then
  echo "ok   a stale MASTER_PORT: named once within $(($(date +%s) - started)) s, srun fails"
else
  fail "a stale MASTER_PORT was not named once"; cat "$scratch/stale.log"
fi
kill "$stale_pid" 2> /dev/null || true
wait "$stale_pid" 2> /dev/null || true

# --- bad input under srun: one message (rank 0's), srun fails, nothing hangs ------------
# srun_refused NAME WANT ENV... -- ARGS...: `srun -n 4 meshtrain train ARGS` under ENV must fail
# within 30 s with exactly one "error:" line, and that line must hold WANT.
srun_refused() {
  local name=$1 want=$2 environment=(); shift 2
  while [ "$1" != -- ]; do environment+=("$1"); shift; done; shift
  local log="$scratch/$name.log" started errors
  started=$(date +%s)
  if env "${environment[@]}" timeout 60 srun -N 1 -n 4 "$meshtrain" train "${job[@]}" \
       --out "$scratch/$name" "$@" > "$log" 2>&1; then
    fail "srun $name exited 0"; return
  fi
  errors=$(grep -c "meshtrain train: error:" "$log" || true)
  if [ "$errors" = 1 ] && grep -q "error:.*$want" "$log" &&
     [ $(($(date +%s) - started)) -lt 30 ]; then
    echo "ok   srun $name: one message, srun fails ($(($(date +%s) - started)) s)"
  else
    fail "srun $name: $errors error lines, want 1 naming '$want'"; cat "$log"
  fi
}
srun_refused layout_not_dividing "does not divide by tp 3" -- --tp 3
srun_refused missing_secret "set MT_JOB_SECRET" -u MT_JOB_SECRET --

# --- elastic.sbatch: meshtrain launch inside the job restarts after a rank dies -----------
if MT_INJECT_FAULT=kill@1:7 WORKERS=4 sbatch_wait elastic "$examples/elastic.sbatch" \
     "${job[@]}" --dp 2 --tp 2 --save_every 5 &&
   grep -q "restart" "$scratch/elastic.out" &&
   same_training "$scratch/ref_dp2tp2" "$scratch/elastic"; then
  echo "ok   elastic.sbatch: a rank killed at step 7, the launcher restarted, bitwise --nproc 4"
else
  fail "elastic.sbatch did not restart into the same training"; tail -n 20 "$scratch/elastic.out"
fi

# --- multinode.sbatch: two nodes (namespaces) with hier across them, or sbatch --test-only ---
if [ "$slurm_nodes" = 2 ]; then
  if sbatch_wait multinode "$examples/multinode.sbatch" "${job[@]}"; then
    nodes=$(scontrol show job "$(cat "$scratch/multinode.jobid")" | grep -o ' NodeList=[^ ]*')
    if [ "$nodes" = " NodeList=mtnode[1-2]" ] &&
       (cd "$scratch" && python3 "$here/../train/compare_runs.py" ref_dp2tp2 multinode 1e-5) \
         > "$scratch/multinode.cmp" 2>&1; then
      echo "ok   multinode.sbatch: 2 ranks on each of mtnode[1-2] (hier) within 1e-5 of --nproc 4"
    else
      fail "multinode.sbatch ran on '$nodes' or trained differently"; cat "$scratch/multinode.cmp"
    fi
  else
    fail "multinode.sbatch failed"; tail -n 20 "$scratch/multinode.out"
  fi
else
  # One slurmd: the script itself on one node, 4 ranks (the multi-node path stays proven by
  # tests/net's namespace tests).
  if sbatch_wait multinode --nodes 1 --ntasks-per-node 4 "$examples/multinode.sbatch" \
       "${job[@]}" &&
     (cd "$scratch" && python3 "$here/../train/compare_runs.py" ref_dp2tp2 multinode 1e-5) \
       > "$scratch/multinode.cmp" 2>&1; then
    echo "ok   multinode.sbatch: on the one node here within 1e-5 of --nproc 4"
  else
    fail "multinode.sbatch on one node"; tail -n 20 "$scratch/multinode.out" "$scratch/multinode.cmp"
  fi
fi
exit "$failed"
