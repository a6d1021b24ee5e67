#!/usr/bin/python3
# PyTorch (fp32, CPU) generation baseline for meshtrain generate: the GPT of gpt_torch.py with
# the same safetensors weights, greedy decoding through its own key/value cache loop.
"""Generate greedily with a KV cache and print `tokens_per_s <x>` (after the first token, as
`meshtrain generate` reports) and `tokens <ids...>`."""
import argparse
import json
import math
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_torch import GPT  # noqa: E402


def load_safetensors(path):
    """Our names (meshtrain's model.safetensors), float32: {name: tensor}, and the metadata."""
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
        data = f.read()
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        array = np.frombuffer(data[begin:end], dtype=np.float32).reshape(info["shape"])
        tensors[name] = torch.from_numpy(array.copy())
    return tensors, meta


def block_step(block, x, cache, position):
    """One block on the new rows x [1, n, c] at positions [position, position + n), appending
    their keys and values to cache (k, v: [heads, context, head size])."""
    attn, (keys, values) = block.attn, cache
    n, c = x.shape[1], x.shape[2]
    heads, hs = attn.heads, c // attn.heads
    q, k, v = attn.qkv(block.ln1(x)).split(c, dim=-1)
    q, k, v = (t.view(n, heads, hs).transpose(0, 1) for t in (q, k, v))
    keys[:, position:position + n] = k
    values[:, position:position + n] = v
    seen = position + n
    scores = (q @ keys[:, :seen].transpose(-2, -1)) * (1.0 / math.sqrt(hs))
    if n > 1:
        future = torch.ones(n, seen, dtype=torch.bool).triu(diagonal=position + 1)
        scores = scores.masked_fill(future, float("-inf"))
    y = torch.softmax(scores, dim=-1) @ values[:, :seen]
    x = x + attn.proj(y.transpose(0, 1).reshape(1, n, c))
    return x + block.mlp(block.ln2(x))


def step(model, caches, tokens, position):
    x = model.wte(tokens)[None] + model.wpe.weight[position:position + len(tokens)]
    for block, cache in zip(model.h, caches):
        x = block_step(block, x, cache, position)
    return model.lnf(x[0, -1]) @ model.wte.weight.T


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("model")
    p.add_argument("--prompt", default="And God said")
    p.add_argument("--prompt_ids", help="the prompt as token ids (a tokenizer's), instead of "
                                         "--prompt's bytes")
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    tensors, meta = load_safetensors(a.model)
    vocab, width = tensors["wte.weight"].shape
    context = tensors["wpe.weight"].shape[0]
    layers = sum(1 for name in tensors if name.endswith(".ln1.weight"))
    heads = int(meta["n_head"])
    model = GPT(vocab, context, layers, heads, width)
    model.load_state_dict(tensors)
    model.eval()
    prompt = [int(i) for i in a.prompt_ids.split()] if a.prompt_ids else list(a.prompt.encode())
    hs = width // heads
    caches = [(torch.zeros(heads, context, hs), torch.zeros(heads, context, hs))
              for _ in range(layers)]
    drawn, times = [], []
    with torch.inference_mode():
        logits = step(model, caches, torch.tensor(prompt), 0)
        position = len(prompt)
        for _ in range(a.tokens):
            token = int(torch.argmax(logits))
            drawn.append(token)
            times.append(time.perf_counter())
            if len(drawn) == a.tokens:
                break
            logits = step(model, caches, torch.tensor([token]), position)
            position += 1
    span = times[-1] - times[0]
    print(f"tokens_per_s {(len(drawn) - 1) / span if span > 0 else 0:.1f}")
    print("tokens " + " ".join(map(str, drawn)), flush=True)


main()
