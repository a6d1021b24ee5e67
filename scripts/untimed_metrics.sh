#!/usr/bin/env bash
# Prints a run's metrics.jsonl without the figures that timing decides (speed, data wait, the step
# accounting), so two runs of the same training compare equal line for line. Usage: FILE.
set -euo pipefail
sed -e 's/, "tokens_per_s": [^,}]*//' -e 's/, "data_ms": [^,}]*//' \
    -e 's/, "accounting": {[^}]*}//' "$1"
