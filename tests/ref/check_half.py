#!/usr/bin/python3
# meshtrain's bf16 gradients against PyTorch's CPU bf16 autocast, both measured against the
# float64 gradients of the same parameters and batch: per tensor, ours may be at most 1.5x off.
"""usage: check_half.py MT_REF_DUMP [PRECISION]

Runs MT_REF_DUMP (build/tests/mt_ref_dump) in PRECISION (bf16 by default) for a few shapes,
recomputes each dump's first gradients in float64 and under torch.autocast("cpu", bfloat16)
in float32, and compares the per-tensor relative L2 errors of the two against float64.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_gpt as ref  # noqa: E402  (the dump reader and the torch GPT)

RATIO = 1.5
KEY_BIAS_ABS = 1e-6  # ours is exactly zero (see check_gpt.py); autocast's is noise
# vocab context layers heads width batch seq: the parity test's odd shapes
SHAPES = ["256 37 2 3 60 3 37", "97 16 3 4 32 4 11"]


def gradients(records, cfg, dtype, autocast):
    params = {name: torch.tensor(records["param/" + name], dtype=dtype, requires_grad=True)
              for name, _ in ref.parameter_shapes(cfg)}
    tokens = torch.tensor(records["tokens"], dtype=torch.long)
    targets = torch.tensor(records["targets"], dtype=torch.long)
    if autocast:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, loss = ref.gpt_forward(params, cfg, tokens, targets)
    else:
        _, loss = ref.gpt_forward(params, cfg, tokens, targets)
    loss.float().backward()
    return {name: p.grad.double().numpy() for name, p in params.items()}


def parts(name, width):
    """The slices compared relatively: a qkv bias without its key slice (checked apart)."""
    if ref.is_qkv_bias(name):
        cuts = ref.qkv_slices(width)
        return [(f"{name}[q]", cuts["q"]), (f"{name}[v]", cuts["v"])]
    return [(name, slice(None))]


def check(records):
    cfg = ref.config_from_records(records)
    exact = gradients(records, cfg, torch.float64, False)
    autocast = gradients(records, cfg, torch.float32, True)
    failures, worst = 0, 0.0
    for name, _ in ref.parameter_shapes(cfg):
        ours = records["grad/" + name].astype(np.float64)
        if ref.is_qkv_bias(name):
            key = ref.qkv_slices(cfg.width)["k"]
            off = ref.max_abs_error(ours[key], exact[name][key])
            if off > KEY_BIAS_ABS:
                failures += 1
                print(f"FAIL {name}[k]: off by {off:.3g} (bound {KEY_BIAS_ABS})")
        for label, cut in parts(name, cfg.width):
            mine = ref.relative_error(ours[cut], exact[name][cut])
            theirs = ref.relative_error(autocast[name][cut], exact[name][cut])
            ratio = mine / theirs if theirs > 0 else (0.0 if mine == 0 else float("inf"))
            worst = max(worst, ratio)
            verdict = "ok" if ratio <= RATIO else "FAIL"
            failures += verdict == "FAIL"
            print(f"{verdict:4} {label:24} meshtrain {mine:.3e}  autocast {theirs:.3e}  "
                  f"ratio {ratio:.2f}")
    print(f"worst ratio {worst:.2f} (bound {RATIO})")
    return failures


def main():
    if len(sys.argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    program = sys.argv[1]
    precision = sys.argv[2] if len(sys.argv) == 3 else "bf16"
    failures = 0
    with tempfile.TemporaryDirectory() as work:
        dump = os.path.join(work, "dump.bin")
        for shape in SHAPES:
            print(f"== {precision}, shape (vocab context layers heads width batch seq): {shape}")
            subprocess.run([program, dump, *shape.split(), precision], check=True, timeout=120)
            failures += check(ref.read_dump(dump))
    print(f"check_half: {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
