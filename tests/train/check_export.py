#!/usr/bin/python3
# Independent checks of `meshtrain export` (json + numpy, and PyTorch for the loss): the file's
# GPT-2 names, shapes and values against a checkpoint, a run's model against it, and its loss.
"""usage:
    check_export.py names FILE CKPT_DIR        every tensor of FILE (GPT-2 names, Conv1D weights
                                               as (in, out)) bitwise the checkpoint's parameter
    check_export.py model FILE OUT             OUT/model.safetensors (meshtrain's names) holds
                                               FILE's values (a run started with --init FILE)
    check_export.py lmhead FILE OUT            writes OUT as a GPT2LMHeadModel's state dict of
                                               FILE: names under "transformer.", the tied
                                               lm_head.weight and the attention mask buffers
    check_export.py loss FILE DATA EVAL_SEQS LOSS
                                               FILE loaded into the PyTorch GPT of
                                               tests/ref/check_gpt.py, and run by a GPT-2 forward
                                               written against its own names (Conv1D: x @ W + b),
                                               gives validation loss LOSS (meshtrain's, over the
                                               same windows) within 1e-5
"""
import json
import math
import os
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "ref"))

# Ours -> GPT-2's, and whether GPT-2 keeps it transposed (Conv1D): Hugging Face's layout.
BLOCK = {"ln1.weight": ("ln_1.weight", False), "ln1.bias": ("ln_1.bias", False),
         "attn.qkv.weight": ("attn.c_attn.weight", True), "attn.qkv.bias": ("attn.c_attn.bias", False),
         "attn.proj.weight": ("attn.c_proj.weight", True), "attn.proj.bias": ("attn.c_proj.bias", False),
         "ln2.weight": ("ln_2.weight", False), "ln2.bias": ("ln_2.bias", False),
         "mlp.fc.weight": ("mlp.c_fc.weight", True), "mlp.fc.bias": ("mlp.c_fc.bias", False),
         "mlp.proj.weight": ("mlp.c_proj.weight", True), "mlp.proj.bias": ("mlp.c_proj.bias", False)}
TOP = {"wte.weight": "wte.weight", "wpe.weight": "wpe.weight", "lnf.weight": "ln_f.weight",
       "lnf.bias": "ln_f.bias"}


def gpt2_name(ours):
    if ours in TOP:
        return TOP[ours], False
    _, layer, rest = ours.split(".", 2)
    theirs, transposed = BLOCK[rest]
    return f"h.{layer}.{theirs}", transposed


def read_safetensors(path):
    """name -> float32 array, and the metadata, read with json and numpy only."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
        data = f.read()
    metadata = header.pop("__metadata__", {})
    tensors, end = {}, 0
    for name, info in header.items():
        assert info["dtype"] == "F32", f"{path}: {name} is {info['dtype']}"
        begin, stop = info["data_offsets"]
        values = np.frombuffer(data[begin:stop], dtype="<f4")
        assert values.size == int(np.prod(info["shape"])), f"{path}: {name}: size and shape differ"
        tensors[name] = values.reshape(info["shape"])
        end = max(end, stop)
    assert end == len(data), f"{path}: {len(data) - end} bytes after the last tensor"
    return tensors, metadata


def expected_names(metadata):
    layers = int(metadata["n_layer"])
    names = {"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"}
    names |= {f"h.{i}.{theirs}" for i in range(layers) for theirs, _ in BLOCK.values()}
    return names


def ours_from_export(tensors):
    """The export's tensors under our names and orientation (as the checkpoint holds them)."""
    result = {}
    layers = sum(1 for n in tensors if n.endswith(".ln_1.weight"))
    ours = list(TOP) + [f"h.{i}.{rest}" for i in range(layers) for rest in BLOCK]
    for name in ours:
        theirs, transposed = gpt2_name(name)
        value = tensors[theirs]
        result[name] = value.T if transposed else value
    return result


def names(path, ckpt):
    import ckpt_tensors
    tensors, metadata = read_safetensors(path)
    wanted = expected_names(metadata)
    if set(tensors) != wanted:
        sys.exit(f"FAIL {path}: tensors {sorted(set(tensors) ^ wanted)[:4]} are extra or missing")
    width, vocab = int(metadata["n_embd"]), int(metadata["vocab_size"])
    shapes = {"wte.weight": (vocab, width), "wpe.weight": (int(metadata["n_positions"]), width),
              "h.0.attn.c_attn.weight": (width, 3 * width), "h.0.attn.c_attn.bias": (3 * width,),
              "h.0.attn.c_proj.weight": (width, width), "h.0.mlp.c_fc.weight": (width, 4 * width),
              "h.0.mlp.c_proj.weight": (4 * width, width), "ln_f.bias": (width,)}
    for name, shape in shapes.items():
        if tensors[name].shape != shape:
            sys.exit(f"FAIL {path}: {name} is {tensors[name].shape}, GPT-2's is {shape}")
    _, saved = ckpt_tensors.read(ckpt)
    ours = ours_from_export(tensors)
    for name, value in ours.items():
        want = saved[(name, "param")]
        got = value.reshape(want.shape)
        if not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
            sys.exit(f"FAIL {path}: {gpt2_name(name)[0]} differs from the checkpoint's {name}")
    print(f"ok {path}: {len(tensors)} tensors with GPT-2's names and shapes, bitwise the "
          f"checkpoint's parameters (step {metadata['meshtrain_step']})")


def model(path, out):
    tensors, _ = read_safetensors(path)
    theirs = ours_from_export(tensors)
    mine, _ = read_safetensors(os.path.join(out, "model.safetensors"))
    for name, value in theirs.items():
        got = mine[name].reshape(value.shape)
        if not np.array_equal(got.view(np.uint32), value.view(np.uint32)):
            sys.exit(f"FAIL {out}: {name} is not the --init file's")
    print(f"ok {out}/model.safetensors: every tensor bitwise the --init file's")


def write_safetensors(path, tensors, metadata):
    header, at = {"__metadata__": metadata}, 0
    for name, value in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(value.shape),
                        "data_offsets": [at, at + value.nbytes]}
        at += value.nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for value in tensors.values():
            f.write(np.ascontiguousarray(value, dtype="<f4").tobytes())


def lmhead(path, out):
    tensors, metadata = read_safetensors(path)
    context = int(metadata["n_positions"])
    mask = np.tril(np.ones((context, context), np.float32)).reshape(1, 1, context, context)
    state = {}
    for name, value in tensors.items():
        state["transformer." + name] = value
        if name.endswith(".ln_1.weight"):
            state["transformer." + name.replace("ln_1.weight", "attn.bias")] = mask
    state["lm_head.weight"] = tensors["wte.weight"]
    write_safetensors(out, state, metadata)
    print(f"ok wrote {out}: {len(state)} tensors")


def validation_windows(data, context, eval_seqs):
    """The windows mt_evaluate takes: eval_seqs of them spread evenly over val.bin."""
    with open(os.path.join(data, "val.bin"), "rb") as f:
        magic, _, width, count, _, _ = struct.unpack("<8sIIQII", f.read(32))
        assert magic == b"MTTOKENS", "not a meshtrain token file"
        dtype = {1: "<u1", 2: "<u2", 4: "<u4"}[width]
        tokens = np.frombuffer(f.read(count * width), dtype=dtype).astype(np.int64)
    windows = (count - 1) // context
    n = min(eval_seqs, windows)
    starts = [(i * windows // n) * context for i in range(n)]
    inputs = np.stack([tokens[s:s + context] for s in starts])
    targets = np.stack([tokens[s + 1:s + context + 1] for s in starts])
    return inputs, targets


def gpt2_forward(t, heads, inputs, targets):
    """Hugging Face GPT-2's forward pass (GPT2LMHeadModel, gelu_new, tied head) on the file's
    own tensors: Conv1D layers compute x @ W + b with W stored (in, out); c_attn's output
    columns are q, k, v, each of heads contiguous head_size columns."""
    import torch
    import torch.nn.functional as F
    def ln(x, prefix):
        return F.layer_norm(x, (x.shape[-1],), t[prefix + ".weight"], t[prefix + ".bias"], eps=1e-5)
    def conv1d(x, prefix):
        return x @ t[prefix + ".weight"] + t[prefix + ".bias"]
    B, T = inputs.shape
    C = t["wte.weight"].shape[1]
    x = t["wte.weight"][inputs] + t["wpe.weight"][:T]
    layers = sum(1 for name in t if name.endswith(".ln_1.weight"))
    for i in range(layers):
        h = f"h.{i}."
        q, k, v = conv1d(ln(x, h + "ln_1"), h + "attn.c_attn").split(C, dim=2)
        q, k, v = (z.view(B, T, heads, C // heads).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(C // heads)
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        y = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + conv1d(y, h + "attn.c_proj")
        m = F.gelu(conv1d(ln(x, h + "ln_2"), h + "mlp.c_fc"), approximate="tanh")
        x = x + conv1d(m, h + "mlp.c_proj")
    logits = ln(x, "ln_f") @ t["wte.weight"].T
    return F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1))


def loss(path, data, eval_seqs, expected):
    import torch
    import check_gpt
    tensors, metadata = read_safetensors(path)
    cfg = check_gpt.Config(vocab=int(metadata["vocab_size"]), context=int(metadata["n_positions"]),
                           layers=int(metadata["n_layer"]), heads=int(metadata["n_head"]),
                           width=int(metadata["n_embd"]))
    params = {name: torch.tensor(np.ascontiguousarray(value).reshape(shape), dtype=torch.float64)
              for (name, shape) in check_gpt.parameter_shapes(cfg)
              for value in [ours_from_export(tensors)[name]]}
    inputs, targets = validation_windows(data, cfg.context, eval_seqs)
    as_gpt2 = {name: torch.tensor(value, dtype=torch.float64) for name, value in tensors.items()}
    inputs, targets = torch.from_numpy(inputs), torch.from_numpy(targets)
    with torch.no_grad():
        _, ours = check_gpt.gpt_forward(params, cfg, inputs, targets)
        theirs = gpt2_forward(as_gpt2, cfg.heads, inputs, targets)
    failed = False
    for what, got in (("the parity test's GPT", ours), ("a GPT-2 forward on its names", theirs)):
        relative = abs(got.item() - expected) / abs(expected)
        verdict = "ok" if relative <= 1e-5 else "FAIL"
        failed |= verdict != "ok"
        print(f"{verdict} {path} in {what} (PyTorch, float64): validation loss {got.item():.7f} "
              f"over {len(inputs)} windows, meshtrain's {expected:.7f}, relative difference "
              f"{relative:.1e}")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    if command == "names":
        names(*args)
    elif command == "model":
        model(*args)
    elif command == "lmhead":
        lmhead(*args)
    elif command == "loss":
        loss(args[0], args[1], int(args[2]), float(args[3]))
    else:
        sys.exit(__doc__)
