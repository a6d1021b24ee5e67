#!/usr/bin/env bash
# --grad_comm in training: bad combinations refused before any worker starts; on dp 2 each hook
# (PowerSGD, signSGD, 1-bit; ZeRO 0 and 1) trains, saving changes nothing and a run resumed
# mid-way (error feedback, Q, SGD momentum from the checkpoint) ends bitwise the uninterrupted
# one; PowerSGD under ZeRO 1 is bitwise ZeRO 0; a hook on one replica is the plain run; the
# bytes in metrics.jsonl are 4 per parameter for the all-reduce and fewer once compressing,
# and over tcp the bytes on the wire are at least those and a quarter of plain for PowerSGD.
# usage: grad_comm.sh MESHTRAIN
set -euo pipefail
meshtrain=$1
scratch=
source "$(dirname "$0")/genesis_setup.sh"
source "$here/expect.sh"

job=(--data "$scratch/data" --vocab 256 --context 16 --layers 2 --heads 4 --width 64
     --batch 8 --steps 8 --warmup 2 --lr 1e-2 --eval_every 0 --sample_tokens 0 --threads 1
     --optimizer sgd --clip 0 --check_every 1 --powersgd_start 3 --onebit_warmup 3)

# --- bad input: one message each, before any worker starts -------------------------------
must_fail "config keys 'grad_comm' and 'zero'.*zero 0 or 1" \
  "$meshtrain" train "${job[@]}" --nproc 2 --grad_comm powersgd --zero 2 --out "$scratch/bad"
must_fail "config keys 'grad_comm' and 'optimizer'.*Adam's variance" \
  "$meshtrain" train "${job[@]}" --nproc 2 --grad_comm onebit --optimizer adamw --out "$scratch/bad"
must_fail "config keys 'grad_comm' and 'precision'.*use bf16" \
  "$meshtrain" train "${job[@]}" --nproc 2 --grad_comm powersgd --precision fp16 --out "$scratch/bad"
must_fail "config key 'powersgd_rank'.*0 is outside" \
  "$meshtrain" train "${job[@]}" --nproc 2 --grad_comm powersgd --powersgd_rank 0 --out "$scratch/bad"
must_fail "config key 'grad_comm': 'topk' is not allreduce, powersgd, signsgd or onebit" \
  "$meshtrain" train "${job[@]}" --nproc 2 --grad_comm topk --out "$scratch/bad"
grep -q "rank 0\|rank 1" "$scratch/fail.log" && fail "a worker started: $(cat "$scratch/fail.log")"
[ -e "$scratch/bad" ] && fail "a refused run made its folder"
echo "ok bad input refused"

# --- one replica: the hook has nothing to send, so the run is the plain one ----------------
train_into "$scratch/one_plain"
train_into "$scratch/one_psgd" --grad_comm powersgd
cmp -s "$scratch/one_plain/model.safetensors" "$scratch/one_psgd/model.safetensors" ||
  fail "PowerSGD on one replica differs from the plain run"
echo "ok a hook on one replica is the plain run"

# --- dp 2 over tcp (so bytes cross a wire): every hook trains, saves without effect and
# resumes bitwise ---------------------------------------------------------------------------
export MT_COMM_BACKEND=tcp
for hook in allreduce powersgd signsgd onebit "powersgd --zero 1"; do
  name=${hook// /_}
  ref="$scratch/ref_$name" saved="$scratch/saved_$name" resumed="$scratch/resumed_$name"
  # shellcheck disable=SC2086
  train_into "$ref" --nproc 2 --grad_comm $hook || continue
  # shellcheck disable=SC2086
  train_into "$saved" --nproc 2 --grad_comm $hook --save_every 5 || continue
  cmp -s "$ref/model.safetensors" "$saved/model.safetensors" || fail "$hook: saving changed the run"
  # shellcheck disable=SC2086
  train_into "$resumed" --nproc 2 --grad_comm $hook --resume "$saved/ckpt/step_5" || continue
  cmp -s "$ref/model.safetensors" "$resumed/model.safetensors" ||
    fail "$hook: resumed from step 5, the model differs from the uninterrupted run's"
  if [ "$hook" != allreduce ]; then
    ls "$saved/ckpt/step_5"/grad_comm.rank{0,1}.bin > /dev/null || fail "$hook: no hook state saved"
  fi
  echo "ok dp 2 $hook: resumed bitwise"
done
cmp -s "$scratch/ref_powersgd/model.safetensors" "$scratch/ref_powersgd_--zero_1/model.safetensors" ||
  fail "PowerSGD: ZeRO 1 differs from ZeRO 0"
cmp -s "$scratch/ref_allreduce/model.safetensors" "$scratch/ref_powersgd/model.safetensors" &&
  fail "PowerSGD left the run as it was: nothing was compressed"

# --- bytes per step: 4 per parameter plainly, far fewer compressed -------------------------
/usr/bin/python3 - "$scratch" <<'PY' || fail "bytes per step"
import json, sys
scratch = sys.argv[1]
def bytes_of(name, key="comm_bytes"):
    return [json.loads(l)[key]["dp"] for l in open(f"{scratch}/{name}/metrics.jsonl")]
plain, psgd = bytes_of("ref_allreduce"), bytes_of("ref_powersgd")
signs, onebit = bytes_of("ref_signsgd"), bytes_of("ref_onebit")
summary = json.load(open(f"{scratch}/ref_allreduce/summary.json"))
params = summary["parameters"]
assert all(b == 4 * params for b in plain), (plain, params)
assert psgd[:2] == plain[:2] and max(psgd[2:]) < plain[0] / 4, psgd  # compressed from step 3
assert all(b == signs[0] for b in signs) and signs[0] < params / 8 + 16, signs
assert onebit[:3] == plain[:3] and onebit[3] < params / 8 + 4 * 64, onebit
# on the wire (tcp, headers included): at least the payload, and compressed far below plain
for name, payload in (("ref_allreduce", plain), ("ref_powersgd", psgd), ("ref_signsgd", signs)):
    wire = bytes_of(name, "wire_bytes")
    assert all(w >= p for w, p in zip(wire, payload)), (name, wire, payload)
wire_plain, wire_psgd = bytes_of("ref_allreduce", "wire_bytes"), bytes_of("ref_powersgd", "wire_bytes")
assert max(wire_psgd[2:]) < wire_plain[-1] / 4, (wire_psgd, wire_plain)
print(f"wire bytes per step (tcp): allreduce {wire_plain[-1]:.0f}, powersgd {wire_psgd[-1]:.0f}, "
      f"signsgd {bytes_of('ref_signsgd', 'wire_bytes')[-1]:.0f}, onebit {bytes_of('ref_onebit', 'wire_bytes')[-1]:.0f}")
print(f"bytes per step: allreduce {plain[0]:.0f}, powersgd {psgd[-1]:.0f}, signsgd {signs[0]:.0f}, onebit {onebit[-1]:.0f}")
PY
exit $failed
