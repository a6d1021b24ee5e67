#!/usr/bin/python3
# An independent reader of meshtrain checkpoints (json + numpy, nothing of meshtrain's code):
# assembles every tensor's parameters and Adam moments from the pieces of the metadata.
#   ckpt_tensors.py same A B     A's and B's tensors bitwise equal (exit 1 naming the first
#                                tensors that differ)
#   ckpt_tensors.py complete D   every committed step_<N> under D (an OUT/ckpt folder) has its
#                                metadata, every shard at its size and header, and pieces that
#                                tile every tensor
import json
import os
import sys

import numpy as np

MAGIC = b"MTSHARD\n"


def read(folder):
    meta = json.load(open(os.path.join(folder, "metadata.json")))
    shapes = {t["name"]: t["shape"] for t in meta["tensors"]}
    files = {f["name"]: f for f in meta["files"]}
    for name, f in files.items():
        path = os.path.join(folder, name)
        with open(path, "rb") as handle:
            header = handle.read(32)
        assert os.path.getsize(path) == f["bytes"], f"{path}: size differs from the metadata"
        assert header[:8] == MAGIC, f"{path}: wrong magic"
        assert int.from_bytes(header[12:16], "little") == f["rank"], f"{path}: wrong rank"
        assert int.from_bytes(header[16:24], "little") == meta["step"], f"{path}: wrong step"
    tensors = {}
    for p in meta["pieces"]:
        key = (p["tensor"], p["state"])
        if key not in tensors:
            tensors[key] = (np.zeros(shapes[p["tensor"]], np.float32),
                            np.zeros(shapes[p["tensor"]], np.int32))
        values, covered = tensors[key]
        with open(os.path.join(folder, p["file"]), "rb") as handle:
            handle.seek(p["at"])
            raw = handle.read(p["bytes"])
        box = tuple(slice(o, o + e) for o, e in zip(p["offset"], p["extent"]))
        values[box] = np.frombuffer(raw, np.float32).reshape(p["extent"])
        covered[box] += 1
    for (name, state), (_, covered) in tensors.items():
        assert (covered == 1).all(), f"{folder}: {name} ({state}) is not tiled exactly once"
    assert len(tensors) == 3 * len(shapes), f"{folder}: a tensor lacks a state"
    return meta, {key: values for key, (values, _) in tensors.items()}


def same(a, b):
    _, x = read(a)
    _, y = read(b)
    if x.keys() != y.keys():
        print(f"FAIL {a} and {b} hold different tensors")
        return 1
    differ = [f"{n} ({s})" for (n, s) in sorted(x)
              if not np.array_equal(x[(n, s)].view(np.uint32), y[(n, s)].view(np.uint32))]
    if differ:
        print(f"FAIL {a} and {b}: {len(differ)} of {len(x)} tensors differ: {', '.join(differ[:4])}")
        return 1
    print(f"ok {a} and {b}: {len(x)} tensors (parameters and moments) bitwise equal")
    return 0


def complete(root):
    steps = [d for d in os.listdir(root) if d.startswith("step_")]
    for d in steps:
        read(os.path.join(root, d))
    print(f"ok {root}: {len(steps)} committed checkpoints, each complete")
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "same":
        sys.exit(same(sys.argv[2], sys.argv[3]))
    sys.exit(complete(sys.argv[2]))
