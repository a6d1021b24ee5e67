#!/usr/bin/env bash
# `meshtrain verify --resume_on`: dp 2 x ZeRO 1 resumed on pp 2, and tp 2 on dp 2 x ZeRO 3 with
# validation losses, pass (the three runs kept, the resumed one starting after the checkpoint);
# a resumed run whose parameters are silently moved (a fault only layout B's rank 1 meets)
# fails naming them; bad layouts B are refused with exit status 2 before any run; SIGINT stops
# verify and its run, leaving nothing.
# Usage: bash tests/cli/verify_resume.sh path/to/meshtrain   (about 8 s in Release on 2 cores)
set -u

if [[ $# -ne 1 || ! -x $1 ]]; then
    echo "usage: $0 path/to/meshtrain" >&2
    exit 2
fi
MT=$1
WORK=$(mktemp -d /tmp/mt_verify_resume_test.XXXXXX) || exit 2
trap 'rm -rf -- "$WORK"' EXIT
export TMPDIR=$WORK/tmp # verify's temporary folders, so that a leftover one is seen
mkdir -p "$TMPDIR"
unset MT_INJECT_FAULT

source "$(dirname "$0")/verify_lib.sh"

# no_run: the last verify started no run.
no_run() {
    [[ -z $problem ]] && grep -q "run: layout" "$WORK/out" && problem="a run started"
}

# 1. dp 2 x ZeRO 1, saved at step 3 of 6, resumed on pp 2 (batch 8: 2 replicas of 4 sequences
# and 4 micro-batches of 2), kept.
kept=$WORK/kept
run 0 --dp 2 --zero 1 --steps 6 --resume_on "--pp 2" --resume_at 3 --keep "$kept"
has "verify: dp 2 x pp 1 x tp 1 (2 ranks), sp off, zero 1" "batch 8) resumed after step 3 on dp 1 x pp 2 x tp 1 (2 ranks), sp off, zero 0, schedule 1f1b, 4 micro-batches" \
    "uninterrupted run: layout A, 2 ranks, steps 1-6" "saving run: layout A, 2 ranks, a checkpoint at step 3" \
    "resumed run: layout B, 2 ranks, steps 4-6 from step 3's checkpoint" \
    "saving:     the checkpointing run is bitwise the uninterrupted one" \
    "resumed on layout B, steps 4-6 and the final model against the uninterrupted run:" \
    "losses:     largest relative difference" "parameters: largest relative difference by norm" \
    "ok: both within the tolerance 1e-05" "the runs are in $kept"
for file in uninterrupted/model.safetensors saved/ckpt/step_3/metadata.json \
    resumed/model.safetensors uninterrupted.log saved.log resumed.log; do
    [[ -z $problem && ! -s $kept/$file ]] && problem="--keep did not keep $file"
done
[[ -z $problem && $(head -c 11 "$kept/resumed/metrics.jsonl") != '{"step": 4,' ]] &&
    problem="the resumed run did not start at step 4: $(head -c 40 "$kept/resumed/metrics.jsonl")"
[[ -z $problem ]] && ! grep -q "resumed from '$kept/saved/ckpt/step_3' at step 3" "$kept/resumed.log" &&
    problem="the resumed run did not resume step 3's checkpoint"
verdict "dp 2 x zero 1 resumed on pp 2"

# 2. tp 2 resumed on dp 2 x ZeRO 3 at the default step (2 of 4), validation losses compared.
run 0 --tp 2 --steps 4 --eval_every 2 --resume_on "--dp 2 --zero 3"
has "resumed after step 2 on dp 2 x pp 1 x tp 1 (2 ranks), sp off, zero 3" \
    "steps 3-4 and the final model" "of 2 training and 1 validation losses" \
    "ok: both within the tolerance 1e-05"
verdict "tp 2 resumed on dp 2 x zero 3, validation losses compared"

# 3. The comparison fails when the resumed run goes astray: the final norm's weight moved after
# step 4's update on world rank 1, which only layout B (pp 2) has.
MT_INJECT_FAULT=skew_norm@1:4 run 1 --steps 6 --resume_on "--pp 2" --resume_at 3
has "FAIL: parameters past the tolerance 1e-05 in" "lnf.weight"
verdict "a resumed run moved off its course fails"

# 4. Layouts B that cannot continue the job, and bad flags: exit status 2, no run.
run 2 --nproc 2 --resume_on "--pp 2 --lr 1e-2"
has "--resume_on '--pp 2 --lr 1e-2': --lr is not a layout key"
no_run
verdict "a non-layout key in layout B"
run 2 --heads 4 --nproc 2 --resume_on "--tp 3"
has "--resume_on '--tp 3': layout B cannot continue the job:" "tp 3 does not divide the 4 attention heads"
no_run
verdict "tp 3 against 4 heads"
run 2 --batch 6 --nproc 2 --resume_on "--dp 4"
has "--resume_on '--dp 4': layout B cannot continue the job:" "a global batch of 6 sequences does not split into 4"
no_run
verdict "a batch layout B cannot split"
run 2 --steps 4 --resume_at 4 --resume_on "--pp 2"
has "--resume_at 4: the checkpoint's step must be in 1..3"
verdict "--resume_at at the last step"
run 2 --resume_at 2
has "--resume_at needs --resume_on"
verdict "--resume_at without --resume_on"
run 2 --resume_on "--pp"
has "--resume_on '--pp': --pp needs a value"
verdict "a layout B key without its value"

# 5. SIGINT while the uninterrupted run trains: verify stops it and dies by SIGINT, leaving
# no process and no folder (env gives verify SIGINT's default, as a terminal's Ctrl-C finds it).
problem=""
timeout 60 env --default-signal=INT "$MT" verify --dp 2 --steps 400 --resume_on "--pp 2" \
    >"$WORK/out" 2>&1 &
waiter=$!
for _ in $(seq 1200); do
    grep -qsF "step 1/" "$TMPDIR"/*/uninterrupted.log && break
    sleep 0.05
done
verify=$(pgrep -P "$waiter")
if [[ -z $verify ]]; then
    problem="verify did not start"
else
    kill -INT "$verify"
fi
wait "$waiter"
status=$?
[[ -z $problem && $status -ne 130 ]] && problem="exit status $status, want 130 (SIGINT)"
has "Interrupt: stopping the uninterrupted run"
pgrep -f -- "$TMPDIR" >/dev/null && problem="runs still going: $(pgrep -af -- "$TMPDIR")"
[[ -z $problem && -n $(ls -A "$TMPDIR") ]] && problem="left in TMPDIR: $(ls -A "$TMPDIR")"
verdict "SIGINT stops the uninterrupted run and verify, leaving nothing"

echo "verify_resume.sh: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
