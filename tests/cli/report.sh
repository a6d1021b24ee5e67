#!/usr/bin/env bash
# ctest cli_report: summary.json's provenance; `meshtrain report` on two runs of different models renders in headless
# Chromium with data in every plot and the verdict listed (a screenshot is kept at SHOT); bad
# input (a folder without metrics, a metrics.jsonl cut short) is named, and what can be drawn
# is drawn. Chromium runs with --no-sandbox: its sandbox refuses to start as root.
# usage: report.sh MESHTRAIN SHOT
set -uo pipefail
meshtrain=$1 shot=$2
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
export TMPDIR=$scratch HOME=$scratch
command -v chromium >/dev/null || { echo "FAIL chromium is not installed (scripts/deps.sh test)"; exit 1; }
bible -f gen1:1-gen2:9 >"$scratch/text.txt"
"$meshtrain" data text "$scratch/text.txt" --out "$scratch/data" >/dev/null || exit 1
job=(--data "$scratch/data" --vocab 256 --context 16 --layers 2 --heads 2 --batch 4 --steps 6
     --warmup 1 --eval_every 3 --sample_tokens 0 --threads 1 --log_every 3)
failed=0
fail() { echo "FAIL $1"; failed=1; }
for width in 32 48; do
  "$meshtrain" train "${job[@]}" --width $width --out "$scratch/w$width" >"$scratch/w$width.log" 2>&1 ||
    { cat "$scratch/w$width.log"; exit 1; }
done

# summary.json's provenance: the command line and the resolved configuration.
/usr/bin/python3 - "$scratch/w48/summary.json" <<'EOF' || fail "summary.json's provenance"
import json, sys
p = json.load(open(sys.argv[1]))["provenance"]
ok = p["command"][1:3] == ["train", "--data"] and "\nwidth = 48\n" in p["config"] and \
     p["ranks"] == 1 and p["hosts"] == 1 and p["started"] <= p["ended"]
print(f"{'ok  ' if ok else 'FAIL'} provenance: {' '.join(p['command'][1:4])} ..., {p['started']} to "
      f"{p['ended']}, {p['ranks']} rank on {p['hosts']} host")
sys.exit(0 if ok else 1)
EOF

# dom PAGE OUT: the page as headless Chromium built it.
dom() {
  timeout 60 chromium --headless --no-sandbox --disable-gpu --dump-dom "file://$1" >"$2" \
    2>"$2.err" || { fail "chromium could not load $1: $(tail -n 3 "$2.err")"; return 1; }
}

"$meshtrain" report "$scratch/w32" "$scratch/w48" >"$scratch/report.log" 2>&1 ||
  { fail "report failed: $(cat "$scratch/report.log")"; exit 1; }
grep -q "w48's model (.*width 48.*) differs from w32's" "$scratch/report.log" ||
  fail "the runs' different models are not named: $(cat "$scratch/report.log")"
page=$scratch/w32/report.html
if dom "$page" "$scratch/dom.html"; then
  /usr/bin/python3 - "$scratch/dom.html" <<'EOF' || fail "the page's plots"
import re, sys
dom = open(sys.argv[1]).read()
plots = re.findall(r'<svg class="plot" data-points="(\d+)"[^>]*><text[^>]*>([^<]*)<', dom)
titles = [t for _, t in plots]
empty = [t for n, t in plots if int(n) == 0]
# five curves, then per run: the breakdown and the memory bars
want = ["training loss", "validation loss", "tokens/s", "learning rate", "gradient norm"]
ok = all(w in titles for w in want) and len(plots) == 9 and not empty
ok = ok and dom.count("<polyline") >= 10 and dom.count('class="part"') >= 4
ok = ok and len(re.findall(r"<li>[a-z]*-bound", dom)) == 2
print(f"{'ok  ' if ok else 'FAIL'} report of 2 runs: {len(plots)} plots ({', '.join(titles)}); "
      f"empty: {empty or 'none'}; {dom.count('<polyline')} curves, "
      f"{dom.count('class=' + chr(34) + 'part' + chr(34))} bar segments")
sys.exit(0 if ok else 1)
EOF
  timeout 60 chromium --headless --no-sandbox --disable-gpu --hide-scrollbars \
    --window-size=1280,1600 --screenshot="$shot" "file://$page" >/dev/null 2>&1 &&
    [[ -s $shot ]] && echo "ok   screenshot kept at $shot" || fail "no screenshot"
fi

# A folder without metrics, alone: refused, named. Beside a run: drawn, and said.
mkdir -p "$scratch/empty"
if "$meshtrain" report "$scratch/empty" >"$scratch/empty.log" 2>&1; then
  fail "a folder without metrics made a report"
elif grep -q "empty: no metrics.jsonl" "$scratch/empty.log" && grep -q "no run to draw" "$scratch/empty.log"; then
  echo "ok   a folder without metrics: $(tail -n 1 "$scratch/empty.log")"
else
  fail "a folder without metrics is not named: $(cat "$scratch/empty.log")"
fi

# metrics.jsonl cut in the middle of its last line: the steps before it are drawn.
cp -r "$scratch/w32" "$scratch/cut"
rm -f "$scratch/cut/summary.json"
size=$(stat -c %s "$scratch/cut/metrics.jsonl")
truncate -s $((size - 40)) "$scratch/cut/metrics.jsonl"
if "$meshtrain" report "$scratch/cut" "$scratch/empty" >"$scratch/cut.log" 2>&1 &&
   grep -q "cut/metrics.jsonl: line 6 is cut short" "$scratch/cut.log" &&
   grep -q "no summary.json" "$scratch/cut.log" && dom "$scratch/cut/report.html" "$scratch/cut.html" &&
   grep -q 'data-points="5"[^>]*><text[^>]*>training loss' "$scratch/cut.html" &&
   grep -q "line 6 is cut short" "$scratch/cut.html"; then
  echo "ok   a metrics.jsonl cut short: 5 steps drawn, the cut line and the missing summary said"
else
  fail "a metrics.jsonl cut short: $(cat "$scratch/cut.log")"
fi
exit $failed
