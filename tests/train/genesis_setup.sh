# Sourced by the equivalence tests: a scratch folder removed at exit, and in it the fixed corpus
# every run trains on (Genesis 1-11 of bible-kjv, a base dependency), so figures never drift.
# Expects $meshtrain; sets $here (the tests' folder), $scratch (the corpus at $scratch/data),
# TMPDIR (inside it) and $untimed (prints a metrics.jsonl without what timing decides).
here=$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)
untimed=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../scripts" && pwd)/untimed_metrics.sh
scratch=${scratch:-$(mktemp -d)}
trap 'rm -rf "$scratch"' EXIT
# the flight-recorder folders that deliberately failed jobs keep go with the scratch folder
export TMPDIR="$scratch/tmp"
mkdir -p "$TMPDIR"
bible -f gen1:1-gen11:32 > "$scratch/genesis.txt"
"$meshtrain" data text "$scratch/genesis.txt" --out "$scratch/data" > /dev/null
