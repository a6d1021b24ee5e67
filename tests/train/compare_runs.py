#!/usr/bin/env python3
"""Compares a training run with a reference run of the same job: per-step losses, gradient norms
and validation losses (relative), and every tensor of OUT/model.safetensors by norm,
|p - p_ref| / |p_ref|. Standard library only.

usage: compare_runs.py REFERENCE_OUT RUN_OUT [TOLERANCE [KEYS]]    (exit 1 past the tolerance)
KEYS: the metrics compared, comma-separated (default loss,grad_norm,val_loss)
Also checks RUN_OUT's step accounting (summary.json): on every rank the parts sum to the
step's wall time within 1%, none is negative, and the rest stays under 5% of it.
"""
import array
import json
import math
import struct
import sys


def metrics(out):
    with open(f"{out}/metrics.jsonl") as f:
        return [json.loads(line) for line in f]


def worst_relative(reference, run, key):
    """The largest relative difference of `key` over the steps that log it in both runs."""
    pairs = [(a.get(key), b.get(key)) for a, b in zip(reference, run) if key in a or key in b]
    if any(None in pair for pair in pairs):
        sys.exit(f"'{key}' is logged at different steps in the two runs")
    return max((abs(a - b) / abs(a) for a, b in pairs), default=0.0)


def tensors(out):
    with open(f"{out}/model.safetensors", "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
        data = f.read()
    result = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        values = array.array("f")
        values.frombytes(data[begin:end])
        result[name] = values
    return result


PARTS = ("forward", "backward", "dp", "tp", "pp", "embedding", "pipeline_idle", "optimizer",
         "data", "checkpoint", "eval", "rest")


def accounting_problems(out):
    """What is wrong with each rank's step accounting in OUT/summary.json (empty: nothing)."""
    with open(f"{out}/summary.json") as f:
        accounting = json.load(f).get("accounting")
    if accounting is None:
        return ["summary.json has no accounting"]
    if accounting["steps"] == 0:
        return []
    problems = []
    for rank in accounting["ranks"]:
        wall, parts = rank["wall_ms"], [rank[name] for name in PARTS]
        if wall <= 0 or abs(sum(parts) - wall) > 0.01 * wall:
            problems.append(f"rank {rank['rank']}: parts sum to {sum(parts):.3f} ms of {wall:.3f}")
        negative = [name for name in PARTS if rank[name] < -0.005 * wall]
        if negative:
            problems.append(f"rank {rank['rank']}: negative {', '.join(negative)}")
        if rank["rest"] > 0.05 * wall:
            problems.append(f"rank {rank['rank']}: the rest is {100 * rank['rest'] / wall:.1f}% "
                            f"of the step")
    return problems


def main():
    reference, run = sys.argv[1], sys.argv[2]
    tolerance = float(sys.argv[3]) if len(sys.argv) > 3 else 1e-5
    ref_steps, run_steps = metrics(reference), metrics(run)
    if len(ref_steps) != len(run_steps):
        sys.exit(f"{run}: {len(run_steps)} steps, the reference has {len(ref_steps)}")
    keys = sys.argv[4].split(",") if len(sys.argv) > 4 else ("loss", "grad_norm", "val_loss")
    worst_loss = max(worst_relative(ref_steps, run_steps, key) for key in keys)
    ref_tensors, run_tensors = tensors(reference), tensors(run)
    if ref_tensors.keys() != run_tensors.keys():
        sys.exit(f"{run}: the model's tensors differ from the reference's")
    worst_param, worst_name = 0.0, ""
    for name, ref in ref_tensors.items():
        got = run_tensors[name]
        diff = math.sqrt(sum((a - b) ** 2 for a, b in zip(ref, got)))
        norm = math.sqrt(sum(a * a for a in ref)) or 1.0
        if diff / norm >= worst_param:
            worst_param, worst_name = diff / norm, name
    problems = accounting_problems(run)
    ok = worst_loss <= tolerance and worst_param <= tolerance and not problems
    print(f"{'ok  ' if ok else 'FAIL'} {run}: losses and norms within {worst_loss:.2e} relative, "
          f"parameters within {worst_param:.2e} ({worst_name}); step accounting "
          f"{'; '.join(problems) if problems else 'sums to the wall time, rest under 5%'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
