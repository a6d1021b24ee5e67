#!/usr/bin/env bash
# --grad_comm in training: bad combinations refused before any worker starts; on dp 2 each hook
# (PowerSGD, signSGD, 1-bit; ZeRO 0 and 1) trains, saving changes nothing and a run resumed
# mid-way (error feedback, Q, SGD momentum from the checkpoint) ends bitwise the uninterrupted
# one; PowerSGD under ZeRO 1 is bitwise ZeRO 0; a hook on one replica is the plain run; the
# bytes in metrics.jsonl are 4 per parameter for the all-reduce and fewer once compressing,
# and over tcp the bytes on the wire are at least those and a quarter of plain for PowerSGD;
# under tp 2 and pp 2 (x dp 2) PowerSGD at full rank is the all-reduce and signSGD trains.
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

# --- tensor and pipeline parallelism compose: the hook acts on each rank's own shards -------
# PowerSGD at R = 64 >= min(n, m) of every shard (no factors are cheaper there, so each shard is
# summed plainly beside the vectors) is the all-reduce within 1e-3 of the update by norm; at R 2
# (factors on each rank's shards) and signSGD it trains to finite losses, unlike the plain run;
# on dp 1 a hook is the plain tp run.
unset MT_COMM_BACKEND
close_models() { # INIT A B TOL: |A - B| <= TOL |A - INIT| over every tensor
  /usr/bin/python3 - "$@" <<'PY'
import json, struct, sys, numpy as np
def flat(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n]); header.pop("__metadata__", None)
    body = data[8 + n:]
    return np.concatenate([np.frombuffer(body[h["data_offsets"][0]:h["data_offsets"][1]],
                                         dtype=np.float32).astype(np.float64)
                           for _, h in sorted(header.items())])
init, a, b = (flat(f"{p}/model.safetensors") for p in sys.argv[1:4])
gap, update = np.linalg.norm(a - b), np.linalg.norm(a - init)
print(f"{sys.argv[3]}: {gap / update:.3g} of the update from {sys.argv[2]}")
sys.exit(not (update > 0 and gap <= float(sys.argv[4]) * update))
PY
}
for layout in "--tp 2" "--pp 2 --microbatches 2"; do
  name=$(echo "$layout" | cut -d' ' -f1,2 | tr -d ' -')
  # shellcheck disable=SC2086
  { train_into "$scratch/${name}_init" --nproc 4 $layout --lr 0 --min_lr 0 &&
    train_into "$scratch/${name}_plain" --nproc 4 $layout &&
    train_into "$scratch/${name}_psgd" --nproc 4 $layout --grad_comm powersgd --powersgd_start 1 \
      --powersgd_rank 64 &&
    train_into "$scratch/${name}_psgd2" --nproc 4 $layout --grad_comm powersgd --powersgd_start 1 &&
    train_into "$scratch/${name}_sign" --nproc 4 $layout --grad_comm signsgd; } || continue
  close_models "$scratch/${name}_"{init,plain,psgd} 1e-3 ||
    fail "$name x dp 2: PowerSGD at full rank is not the all-reduce"
  for hook in psgd2 sign; do
    losses=$(metric_column "$scratch/${name}_$hook" loss)
    # shellcheck disable=SC2086  # one argument per step
    /usr/bin/python3 -c 'import math, sys; v = [float(x) for x in sys.argv[1:]]
sys.exit(not (len(v) == 8 and all(map(math.isfinite, v))))' $losses ||
      fail "$name x dp 2: $hook losses $losses"
    cmp -s "$scratch/${name}_plain/model.safetensors" "$scratch/${name}_$hook/model.safetensors" &&
      fail "$name x dp 2: $hook left the run as it was"
  done
  echo "ok $name x dp 2: PowerSGD at full rank is the all-reduce, at rank 2 and signSGD it trains"
done
train_into "$scratch/tp2_dp1_plain" --nproc 2 --tp 2 &&
  train_into "$scratch/tp2_dp1_psgd" --nproc 2 --tp 2 --grad_comm powersgd &&
  { cmp -s "$scratch/tp2_dp1_"{plain,psgd}/model.safetensors ||
      fail "tp 2 x dp 1: PowerSGD differs from the plain run"; } &&
  echo "ok tp 2 x dp 1: a hook is the plain run"

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
