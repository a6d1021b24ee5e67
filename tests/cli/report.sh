#!/usr/bin/env bash
# ctest cli_report: summary.json's provenance, the run's log, --accounting off, --memory_limit; `meshtrain report` on two runs of different models renders in headless
# Chromium with data in every plot and the verdict listed (a screenshot is kept at SHOT); bad
# input (a folder without metrics, a metrics.jsonl cut short) is named, and what can be drawn
# is drawn. Chromium runs with --no-sandbox: its sandbox refuses to start as root.
# usage: report.sh MESHTRAIN SHOT SOURCE_DIR
set -uo pipefail
meshtrain=$1 shot=$2 src=$3
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
  traced=()
  [[ $width == 48 ]] && traced=(--trace "$scratch/w48/trace.json")
  "$meshtrain" train "${job[@]}" --width $width "${traced[@]}" --out "$scratch/w$width" \
    >"$scratch/w$width.log" 2>&1 || { cat "$scratch/w$width.log"; exit 1; }
done

# summary.json's provenance: the command line, the resolved configuration, the build's commit
# (a commit of this tree, "-dirty" when tracked files differed; "unknown" outside a git tree)
# and flags, and every data file with its size and XXH3 (the same for both runs of one corpus).
commit=$(/usr/bin/python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["provenance"]["commit"])' "$scratch/w48/summary.json")
if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
  git -C "$src" cat-file -e "${commit%-dirty}^{commit}" 2>/dev/null ||
    fail "provenance: commit '$commit' is not a commit of $src"
  known=${commit%-dirty}
else
  known=unknown
fi
/usr/bin/python3 - "$scratch/w48/summary.json" "$scratch/w32/summary.json" "$scratch/data" "$known" \
  <<'EOF' || fail "summary.json's provenance"
import json, os, re, sys
p = json.load(open(sys.argv[1]))["provenance"]
other = json.load(open(sys.argv[2]))["provenance"]
files = {f["path"]: f for f in p["data_files"]}
ok = p["command"][1:3] == ["train", "--data"] and "\nwidth = 48\n" in p["config"] and \
     p["ranks"] == 1 and p["hosts"] == 1 and p["started"] <= p["ended"]
ok = ok and re.fullmatch(re.escape(sys.argv[4]) + "(-dirty)?", p["commit"]) and "-O" in p["flags"]
ok = ok and sorted(files) == ["meta.json", "train.bin", "val.bin"] and \
     all(f["bytes"] == os.path.getsize(f"{sys.argv[3]}/{n}") and re.fullmatch("[0-9a-f]{16}", f["xxh3"])
         for n, f in files.items()) and p["data_files"] == other["data_files"] and \
     files["train.bin"]["xxh3"] != files["val.bin"]["xxh3"]
print(f"{'ok  ' if ok else 'FAIL'} provenance: {' '.join(p['command'][1:4])} ..., {p['started']} to "
      f"{p['ended']}, {p['ranks']} rank on {p['hosts']} host, commit {p['commit']}, {p['compiler']} "
      f"{p['flags']}, train.bin xxh3 {files.get('train.bin', {}).get('xxh3')}")
sys.exit(0 if ok else 1)
EOF
mkdir -p "$scratch/notgit"
cmake -DSRC="$scratch/notgit" -DOUT="$scratch/notgit/info.c" -DCOMPILER=cc -DFLAGS=-O3 \
  -P "$src/scripts/build_info.cmake" && grep -q 'trainer_build_commit\[\] = "unknown"' "$scratch/notgit/info.c" &&
  echo "ok   outside a git tree the commit is unknown" || fail "build_info.cmake outside a git tree"

# Each run's log: its start and stop, timestamped.
grep -qE '^[0-9-]{10}T[0-9:.]{12}Z start: rank 0 of 1 ' "$scratch/w32/logs/rank0.log" &&
  grep -qE 'Z stop: ok, 6 steps' "$scratch/w32/logs/rank0.log" && echo "ok   logs/rank0.log" ||
  fail "logs/rank0.log: $(cat "$scratch/w32/logs/rank0.log")"

# --accounting off: no accounting in the metrics or the summary; the verdict says why.
"$meshtrain" train "${job[@]}" --width 32 --accounting off --out "$scratch/off" >"$scratch/off.log" 2>&1 &&
  ! grep -q accounting "$scratch/off/metrics.jsonl" &&
  /usr/bin/python3 -c 'import json, sys; s = json.load(open(sys.argv[1])); sys.exit("accounting" in s or s["verdict"]["bound"] != "unknown")' "$scratch/off/summary.json" &&
  grep -q "verdict: unknown: --accounting off" "$scratch/off.log" && echo "ok   --accounting off" ||
  fail "--accounting off: $(tail -n 3 "$scratch/off.log")"

# --memory_limit against the w32 run's table: 2% above it is memory-bound (the figure named),
# below it is refused before training (the rank named, no step taken).
total=$(/usr/bin/python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["memory"][0]["total"])' "$scratch/w32/summary.json")
"$meshtrain" train "${job[@]}" --width 32 --memory_limit $((total * 102 / 100)) --out "$scratch/near" \
  >"$scratch/near.log" 2>&1 &&
  grep -q "verdict: memory-bound: rank 0's memory table peaks at .*, 98% of --memory_limit" "$scratch/near.log" &&
  grep -q '"kind": "memory-bound"' "$scratch/near/summary.json" && echo "ok   near --memory_limit: memory-bound" ||
  fail "near --memory_limit: $(grep verdict "$scratch/near.log")"
if "$meshtrain" train "${job[@]}" --width 32 --memory_limit $((total - 1024)) --out "$scratch/over" \
   >"$scratch/over.log" 2>&1; then
  fail "a run above --memory_limit trained"
elif grep -q "error: config key 'memory_limit': rank 0's memory table holds .* above the limit" "$scratch/over.log" &&
     [[ ! -s $scratch/over/metrics.jsonl ]]; then
  echo "ok   above --memory_limit: refused before training"
else
  fail "above --memory_limit: $(cat "$scratch/over.log")"
fi

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
# w48 ran with --trace: its last step as a timeline, one lane (one rank), its spans drawn
timeline = re.findall(r'<svg class="plot timeline" data-lanes="(\d+)" data-points="(\d+)"[^>]*><text[^>]*>([^<]*)<', dom)
ok = ok and len(timeline) == 1 and timeline[0][0] == "1" and int(timeline[0][1]) >= 3 and \
     "step 6 on 1 rank" in timeline[0][2] and dom.count('class="span"') == int(timeline[0][1])
titles.append(f"{timeline[0][2]} ({timeline[0][1]} spans)" if timeline else "NO TIMELINE")
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
