#!/usr/bin/env bash
# Safetensors interchange and inspection: `meshtrain export` of a 3D checkpoint has GPT-2's
# names, shapes and the checkpoint's values (an independent json + numpy reader) and gives
# meshtrain's validation loss in PyTorch's GPT of tests/ref; `train --init` starts any layout
# from it (or from a GPT2LMHeadModel state dict, or a model.safetensors) with exactly its values,
# and trains on 3D as on one process within 1e-5; `ckpt inspect` lists and verifies a
# checkpoint and names damage; bad input is a clear error.
# usage: export.sh MESHTRAIN [quick]   (quick: a tp2 x pp2 checkpoint, for the sanitizers)
set -euo pipefail
meshtrain=$1
quick=${2:-}
source "$(dirname "$0")/genesis_setup.sh"
check=(/usr/bin/python3 "$here/check_export.py")
source "$here/expect.sh"

job=(--data "$scratch/data" --vocab 257 --context 16 --layers 4 --heads 4 --width 32
     --batch 24 --warmup 2 --lr 5e-4 --eval_seqs 11 --sample_tokens 0 --threads 1)
mesh=(--nproc 8 --dp 2 --pp 2 --tp 2 --sp on --microbatches 2 --zero 1)
[ -n "$quick" ] && mesh=(--nproc 4 --tp 2 --pp 2 --sp on --microbatches 2)

src="$scratch/src"
train_into "$src" --steps 6 --save_every 6 --eval_every 6 "${mesh[@]}" || exit 1
ckpt="$src/ckpt/step_6"

# --- ckpt inspect ------------------------------------------------------------------------------
"$meshtrain" ckpt inspect "$src" > "$scratch/inspect.txt" || fail "inspect of a sound checkpoint"
grep -q "^step 6, 144 sequences trained; written by" "$scratch/inspect.txt" || fail "inspect: no step line"
grep -q "^  h.0.attn.qkv.weight \[0:3, 0:32, 0:32\]$" "$scratch/inspect.txt" || fail "inspect: no qkv shape"
grep -Eq "^    param      rank[0-9] \[0:3, 0:16, 0:32\] rank[0-9] \[0:3, 16:32, 0:32\]" "$scratch/inspect.txt" || fail "inspect: no tensor-parallel boxes"
grep -q "^verified: [0-9]* pieces .* every checksum matches$" "$scratch/inspect.txt" || fail "inspect: no verification"
bad="$scratch/bad"
cp -r "$ckpt" "$bad"
printf '\xff' | dd of="$bad/rank1.shard" bs=1 seek=3000 conv=notrunc 2>/dev/null
must_fail "DAMAGED: checkpoint shard '.*rank1.shard': tensor '.*' \(.*\): checksum" "$meshtrain" ckpt inspect "$bad"
grep -q "^FAILED: 1 of [0-9]* pieces are damaged" "$scratch/fail.log" || fail "inspect: one damaged piece not counted"
mkdir -p "$scratch/empty"
must_fail "'.*empty' holds no committed checkpoint" "$meshtrain" ckpt inspect "$scratch/empty"
must_fail "'.*nothing' is not a folder" "$meshtrain" ckpt inspect "$scratch/nothing"
echo "ok ckpt inspect: layout, shapes and boxes listed, checksums verified, a flipped byte named"

# --- export: GPT-2's names and values, PyTorch's loss ---------------------------------------
model="$scratch/gpt2.safetensors"
"$meshtrain" export --ckpt "$ckpt" --out "$model" > /dev/null || fail "export"
"${check[@]}" names "$model" "$ckpt" || failed=1
val=$(grep -o '"val_loss": [0-9.e+-]*' "$src/metrics.jsonl" | tail -1 | cut -d' ' -f2)
"${check[@]}" loss "$model" "$scratch/data" 11 "$val" || failed=1
must_fail "holds no committed checkpoint" "$meshtrain" export --ckpt "$scratch/empty" --out "$scratch/x.safetensors"
must_fail "export needs --ckpt DIR and --out FILE" "$meshtrain" export --ckpt "$ckpt"
# a piece damaged: the export fails halfway through writing and leaves nothing behind
must_fail "rank1.shard': tensor '.*' \(param .*checksum" "$meshtrain" export --ckpt "$bad" --out "$scratch/x.safetensors"
[ -e "$scratch/x.safetensors" ] || [ -e "$scratch/x.safetensors.partial" ] && fail "a failed export left a file"

# --- train --init --------------------------------------------------------------------------
# lr 0: one step changes nothing, so OUT/model.safetensors is what --init loaded
frozen=(--steps 1 --lr 0 --min_lr 0 --eval_every 0)
train_into "$scratch/init_one" --init "$model" "${frozen[@]}" && "${check[@]}" model "$model" "$scratch/init_one" || failed=1
train_into "$scratch/init_mesh" --init "$model" "${frozen[@]}" "${mesh[@]}" && "${check[@]}" model "$model" "$scratch/init_mesh" || failed=1
grep -q "parameters from '$model'" "$scratch/init_mesh.log" || fail "--init not reported"
"${check[@]}" lmhead "$model" "$scratch/lmhead.safetensors" > /dev/null
train_into "$scratch/init_lmhead" --init "$scratch/lmhead.safetensors" "${frozen[@]}" && "${check[@]}" model "$model" "$scratch/init_lmhead" || failed=1
# our own names (model.safetensors, which carries GPT-2's config keys too)
"$meshtrain" train --data "$scratch/data" --init "$src/model.safetensors" --out "$scratch/init_ours" \
  --threads 1 --sample_tokens 0 "${frozen[@]}" > "$scratch/init_ours.log" 2>&1 || fail "--init of a model.safetensors"
cmp -s "$src/model.safetensors" "$scratch/init_ours/model.safetensors" || fail "--init of a model.safetensors: another model"
must_fail "config key 'heads': 8 contradicts the --init file .*, trained with 4" \
  "$meshtrain" train --data "$scratch/data" --init "$src/model.safetensors" --heads 8 --out "$scratch/x"
echo "ok --init: GPT-2 names, a GPT2LMHeadModel state dict and model.safetensors load bitwise on one process and 3D"

# trained from the file: the 3D layout as one process, within 1e-5
train_into "$scratch/from_one" --init "$model" --steps 6 --eval_every 3 || failed=1
train_into "$scratch/from_mesh" --init "$model" --steps 6 --eval_every 3 "${mesh[@]}" || failed=1
/usr/bin/python3 "$here/compare_runs.py" "$scratch/from_one" "$scratch/from_mesh" 1e-5 || failed=1

must_fail "config key 'width': 64 contradicts the --init file '.*gpt2.safetensors', trained with 32" \
  "$meshtrain" train --data "$scratch/data" --init "$model" --width 64 --out "$scratch/x"
must_fail "config keys 'init' and 'resume': a resumed run's parameters come from the checkpoint" \
  "$meshtrain" train --data "$scratch/data" --init "$model" --resume "$ckpt" --out "$scratch/x"
must_fail "cannot open '.*missing.safetensors'" "$meshtrain" train --data "$scratch/data" --init "$scratch/missing.safetensors" --out "$scratch/x"
# a shape only the file gives: the launcher's checks before any worker starts use it (tp 3
# divides 3 heads; the default 4 it does not)
three="$scratch/three"
train_into "$three" --layers 2 --heads 3 --width 24 --steps 1 --save_every 1
"$meshtrain" export --ckpt "$three" --out "$three.safetensors" > /dev/null || fail "export of the 3-head run"
"$meshtrain" train --data "$scratch/data" --init "$three.safetensors" --nproc 3 --tp 3 --threads 1 \
  --sample_tokens 0 "${frozen[@]}" --out "$scratch/init_tp3" > "$scratch/init_tp3.log" 2>&1 || { fail "--init on tp 3"; tail -3 "$scratch/init_tp3.log"; }
"$meshtrain" train --data "$scratch/data" --init "$three.safetensors" --nproc 3 --tp 3 --dry-run > "$scratch/dry.log" 2>&1 || fail "--dry-run with --init"
grep -q "2 layers" "$scratch/dry.log" || { fail "--dry-run did not take the file's shape"; cat "$scratch/dry.log"; }

# a tensor of another model, an LM head not tied to the embeddings, a block missing
/usr/bin/python3 - "$here" "$model" "$scratch" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import check_export
tensors, metadata = check_export.read_safetensors(sys.argv[2])
extra = dict(tensors, **{"h.0.attn.rotary": tensors["ln_f.bias"]})
check_export.write_safetensors(sys.argv[3] + "/extra.safetensors", extra, metadata)
untied = dict(tensors, **{"lm_head.weight": tensors["wte.weight"] * 2})
check_export.write_safetensors(sys.argv[3] + "/untied.safetensors", untied, metadata)
shallow = {name: value for name, value in tensors.items() if not name.startswith("h.1.")}
check_export.write_safetensors(sys.argv[3] + "/shallow.safetensors", shallow, metadata)
PY
must_fail "tensor 'h.0.attn.rotary' is none of this GPT's 52 parameters \(a file of another model\)" \
  "$meshtrain" train "${job[@]}" --init "$scratch/extra.safetensors" --out "$scratch/x"
must_fail "tensor 'lm_head.weight' is none .*an LM head not tied to wte" \
  "$meshtrain" train "${job[@]}" --init "$scratch/untied.safetensors" --out "$scratch/x"
must_fail "shallow.safetensors': its metadata says n_layer 4, its tensors 1" \
  "$meshtrain" train --data "$scratch/data" --init "$scratch/shallow.safetensors" --out "$scratch/x"
cp "$model" "$scratch/truncated.safetensors"
truncate -s -4 "$scratch/truncated.safetensors"
must_fail "truncated.safetensors': tensor '.*': data_offsets .* run past the data area" \
  "$meshtrain" train "${job[@]}" --init "$scratch/truncated.safetensors" --out "$scratch/x"
echo "ok --init refuses a contradicting shape, --resume with it, a missing file, foreign tensors, a missing block and a truncated file"
exit $failed
