#!/usr/bin/env python3
"""Checks the parameter servers' log of an ssp run against its staleness bound S: every pull of
clock c was answered with clocks <= c - S - 1 applied and the slowest live worker past c - S - 1
(no worker ran more than S clocks ahead), and every applied gradient's staleness (clocks its
parameters missed) is at most S. Prints the staleness counts; exit 1 on a breach.

usage: ps_stale.py LOG S
"""
import re
import sys

log, bound = sys.argv[1], int(sys.argv[2])
pulls = applies = 0
breaches = []
counts = {}
for line in open(log, errors="replace"):
    m = re.search(r"ps pull: server (\d+) worker (\d+) clock (\d+) applied (\d+) slowest (-?\d+)", line)
    if m:
        server, worker, clock, applied, slowest = map(int, m.groups())
        pulls += 1
        if applied < clock - bound - 1 or slowest < clock - bound - 1:
            breaches.append(line.strip())
    m = re.search(r"ps apply: server (\d+) clock (\d+) worker (\d+) staleness (\d+)", line)
    if m:
        staleness = int(m.group(4))
        applies += 1
        counts[staleness] = counts.get(staleness, 0) + 1
        if staleness > bound:
            breaches.append(line.strip())
print(f"{pulls} pulls, {applies} applied gradients, staleness counts {dict(sorted(counts.items()))}, "
      f"{len(breaches)} past the bound {bound}")
for b in breaches[:5]:
    print("  " + b)
sys.exit(1 if breaches or not pulls or not applies else 0)
