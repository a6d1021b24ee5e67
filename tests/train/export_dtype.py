#!/usr/bin/python3
# Independent checks of `meshtrain export --dtype` and `train --init` of half-precision files
# (json, numpy and PyTorch's own conversions: round to nearest even).
"""usage:
    export_dtype.py check DIR                       for bf16 and f16: every tensor of
                                                    DIR/<dtype>.safetensors is DIR/f32.safetensors'
                                                    rounded by PyTorch, bit for bit, and
                                                    DIR/init_<dtype>/model.safetensors (a run with
                                                    --init of that file, lr 0) holds its values
                                                    widened exactly
    export_dtype.py baddtype HALF_FILE OUT          OUT: HALF_FILE with its first tensor's dtype
                                                    renamed to the unknown F7 (same length)
"""
import json
import struct
import sys


def dtypes():
    import torch  # only the checks need it (a second or more to import)
    return torch, {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def read(path):
    """name -> (dtype name, float32 tensor of its values)."""
    torch, DTYPES = dtypes()
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
        data = f.read()
    header.pop("__metadata__", None)
    out = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        raw = bytearray(data[begin:end])
        dtype = DTYPES[info["dtype"]]
        values = torch.frombuffer(raw, dtype=dtype) if raw else torch.zeros(0, dtype=dtype)
        out[name] = (info["dtype"], values.reshape(info["shape"]).float())
    return out


def rounded(f32_path, half_path):
    torch, DTYPES = dtypes()
    full, half = read(f32_path), read(half_path)
    assert full.keys() == half.keys(), "the two files name different tensors"
    for name, (dtype, values) in half.items():
        want = full[name][1].to(DTYPES[dtype]).float()
        assert dtype in ("BF16", "F16"), f"{name} is {dtype}"
        assert torch.equal(values.view(torch.int32), want.view(torch.int32)), \
            f"{name}: not the F32 values rounded to {dtype}"
    print(f"ok {half_path}: {len(half)} tensors of {dtype}, each PyTorch's rounding of F32")


def widened(half_path, out):
    torch, _ = dtypes()
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from check_export import gpt2_name
    half, model = read(half_path), read(out + "/model.safetensors")
    for ours, (_, values) in model.items():
        theirs, transposed = gpt2_name(ours)
        want = half[theirs][1]
        want = want.t() if transposed else want
        assert torch.equal(values.reshape(want.shape).view(torch.int32),
                           want.contiguous().view(torch.int32)), f"{ours}: not {theirs} widened"
    print(f"ok {out}: {len(model)} tensors, exactly {half_path}'s values")


def baddtype(half_path, out):
    with open(half_path, "rb") as f:
        blob = f.read()
    (length,) = struct.unpack("<Q", blob[:8])
    header = blob[8:8 + length].decode()
    for dtype in ('"BF16"', '"F16"'):
        if dtype in header:
            # the same number of bytes, so every offset stays right: only the name is unknown
            header = header.replace(dtype, '"F7"' + " " * (len(dtype) - 4), 1)
            break
    with open(out, "wb") as f:
        f.write(blob[:8] + header.encode() + blob[8 + length:])


def check(folder):
    for dtype in ("bf16", "f16"):
        rounded(f"{folder}/f32.safetensors", f"{folder}/{dtype}.safetensors")
        widened(f"{folder}/{dtype}.safetensors", f"{folder}/init_{dtype}")


if __name__ == "__main__":
    {"check": check, "baddtype": baddtype}[sys.argv[1]](*sys.argv[2:])
