#!/usr/bin/env bash
# --diloco_group host across two "hosts" of scripts/slow_net.sh (2 ranks each): the ranks of a
# host are one replica (DDP among them), so with --optimizer sgd and --clip 0 one local step with
# avg trains DDP's model on the same 4 ranks (losses, validation losses and parameters within
# 1e-6), on 2 replicas; 4 local steps train another model, and resume mid-round bitwise. Needs root (ip netns, tc).
# Usage: diloco_hosts.sh MESHTRAIN SOURCE_DIR   (about 10 s)
set -uo pipefail
meshtrain=$1
src=$2
if [ "$(id -u)" != 0 ] || ! command -v ip > /dev/null || ! command -v tc > /dev/null; then
  echo "SKIPPED: needs root and iproute2 (ip, tc) to make network namespaces" >&2
  exit 77
fi
scratch=
source "$src/tests/train/genesis_setup.sh"
source "$src/tests/train/expect.sh"
job=(--data "$scratch/data" --vocab 256 --context 16 --layers 2 --heads 4 --width 64
     --batch 24 --steps 12 --warmup 2 --eval_every 6 --eval_seqs 8 --sample_tokens 0
     --threads 1 --check_every 1 --optimizer sgd --clip 0 --lr 0.1 --min_lr 0.01)
hosts() {
  local out=$1; shift
  bash "$src/scripts/slow_net.sh" --hosts 2 --nproc 2 --rate 1gbit --timeout 120 "$meshtrain" -- \
    "$meshtrain" train "${job[@]}" --out "$out" "$@" > "$out.log" 2>&1 ||
    { fail "the 2-host run into $out failed"; tail -n 30 "$out.log"; return 1; }
}
train_into "$scratch/ddp" --nproc 4
if hosts "$scratch/host1" --local_steps 1 --outer_optimizer avg --diloco_group host; then
  grep -q "local steps: 1 per round on 2 replica(s)" "$scratch/host1.log" ||
    fail "the host grouping did not make 2 replicas: $(grep 'local steps' "$scratch/host1.log")"
  /usr/bin/python3 "$src/tests/train/compare_runs.py" "$scratch/ddp" "$scratch/host1" 1e-6 loss,val_loss ||
    fail "diloco_group host with one local step differs from DDP"
fi
if hosts "$scratch/host4" --local_steps 4 --diloco_group host --save_every 6; then
  if /usr/bin/python3 "$src/tests/train/compare_runs.py" "$scratch/ddp" "$scratch/host4" 1e-6 loss > /dev/null; then
    fail "4 local steps per host trained DDP's model"
  fi
  # resumed mid-round (step 6 of rounds of 4) on the same hosts: the same model, bit for bit
  if hosts "$scratch/host4r" --local_steps 4 --diloco_group host --resume "$scratch/host4/ckpt/step_6"; then
    cmp -s "$scratch/host4/model.safetensors" "$scratch/host4r/model.safetensors" ||
      fail "diloco_group host resumed at step 6 differs from the uninterrupted run"
  fi
fi
[ $failed = 0 ] && echo "diloco_group host on 2 hosts x 2 ranks: ok"
exit $failed
