# Sourced by the generation tests: the Genesis corpus of genesis_setup.sh and a tiny GPT trained
# on it for 30 steps (4 layers of 4 heads, width 64, context 32: splits over tp 2 and pp 2),
# saved as $scratch/run/model.safetensors and the checkpoint $scratch/run/ckpt/step_30.
source "$(dirname "${BASH_SOURCE[0]}")/../train/genesis_setup.sh"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
"$meshtrain" train --data "$scratch/data" --context 32 --batch 8 --steps 30 --layers 4 \
  --heads 4 --width 64 --eval_every 0 --sample_tokens 0 --threads 1 --save_every 30 \
  --out "$scratch/run" > "$scratch/train.log" 2>&1 || { cat "$scratch/train.log"; exit 1; }
