#!/usr/bin/env python3
# Two runs' metrics.jsonl agree on what a step computes: for every step of RESUMED (after its
# resume), the last line of that step in WHOLE has the same loss, lr, grad_norm, loss_scale and
# skip fields, exactly; and their summary.json agree on the skips, rollbacks and batches left out.
"""usage: compare_steps.py WHOLE_OUT RESUMED_OUT"""
import json
import sys

FIELDS = ("loss", "lr", "grad_norm", "loss_scale", "skipped", "skip_reason")
SUMMARY = ("steps", "optimizer_steps", "overflow_skips", "spike_skips", "rollbacks",
           "left_out_batches", "loss_scale")


def steps(out):
    last = {}
    for line in open(f"{out}/metrics.jsonl"):
        record = json.loads(line)
        if "event" not in record:
            last[record["step"]] = record
    return last


whole, resumed = sys.argv[1], sys.argv[2]
a, b = steps(whole), steps(resumed)
summary = [json.load(open(f"{out}/summary.json")) for out in (whole, resumed)]
start = summary[1].get("resumed_from_step", 0)
bad = [f"step {s} {f}: {a[s].get(f)} against {b[s].get(f)}" for s in b if s > start
       for f in FIELDS if a.get(s, {}).get(f) != b[s].get(f)]
bad += [f"summary {k}: {summary[0].get(k)} against {summary[1].get(k)}" for k in SUMMARY
        if summary[0].get(k) != summary[1].get(k)]
if bad:
    sys.exit("FAIL " + "\n".join(bad[:10]))
print(f"ok {resumed}: steps {start + 1}-{max(b)} as in {whole}")
