#!/usr/bin/env bash
# The launcher's failure policy by role (src/launch/launch_policy.c): under --ps-servers with
# --ps-mode ssp or async a worker's death is dropped and the job goes on, and under
# --max-restarts that rank alone starts again and rejoins its server over a channel; a server's
# death fails the job (or restarts it whole); sync, as without servers, fails on any death.
# Usage: bash tests/comm/ps_policy.sh path/to/meshtrain path/to/channel_rank
set -u

if [[ $# -lt 2 || ! -x $1 || ! -x $2 ]]; then
    echo "usage: $0 path/to/meshtrain path/to/channel_rank" >&2
    exit 2
fi
MT=$1
RANKPROG=$2
WORK=$(mktemp -d /tmp/mt_ps_policy.XXXXXX) || exit 2
trap 'rm -rf -- "$WORK"' EXIT
export MT_COMM_TIMEOUT=20
export TMPDIR=$WORK
unset MT_JOB_SECRET MT_JOB_SECRET_FILE RANK WORLD_SIZE MASTER_ADDR MASTER_PORT

passed=0
failed=0
fail() {
    echo "FAIL: $1"
    sed 's/^/    | /' "$WORK/out" | tail -25
    failed=$((failed + 1))
}
pass() {
    echo "ok: $1"
    passed=$((passed + 1))
}
# check NAME WANT_STATUS PHRASE...: the last job's status and every phrase (grep -E) in its output.
check() {
    local name=$1 want=$2
    shift 2
    if [[ $status -ne $want ]]; then
        fail "$name: exit status $status, want $want"
        return
    fi
    for phrase in "$@"; do
        if ! grep -qE -- "$phrase" "$WORK/out"; then
            fail "$name: output lacks '$phrase'"
            return
        fi
    done
    pass "$name"
}
# launch ARGS... -- COMMAND: runs the job (bounded) into $WORK/out, its status in $status.
launch() {
    timeout 60 "$MT" launch --grace 1 "$@" >"$WORK/out" 2>&1
    status=$?
}

# Ranks 0-2 work, rank 3 serves; the worker named by DIE (or the server) kills itself in its
# first life, the others finish after a moment.
cat >"$WORK/job.sh" <<'EOF'
#!/usr/bin/env bash
if [[ $RANK == "$DIE" && $MT_INCARNATION == 0 && ${MT_RESTART_COUNT:-0} == 0 ]]; then
    kill -9 $$
fi
sleep 0.5
echo "rank $RANK (incarnation $MT_INCARNATION, attempt ${MT_RESTART_COUNT:-0}) finished"
EOF
chmod +x "$WORK/job.sh"

DIE=1 launch --nproc-per-node 4 --ps-servers 1 --ps-mode async -- "$WORK/job.sh"
check "async: a worker's death is dropped, the job goes on and ends well" 0 \
    "rank 1 \(pid [0-9]+ on host .*, incarnation 0\) was killed by signal 9.*dropped, the job goes on without it \(--ps-mode async" \
    "\[0\] rank 0 .* finished" "\[2\] rank 2 .* finished" "\[3\] rank 3 .* finished"

DIE=3 launch --nproc-per-node 4 --ps-servers 1 --ps-mode async -- "$WORK/job.sh"
check "async: a server's death fails the job" 1 "rank 3 \(pid [0-9]+ on host .*\) was killed by signal 9"

DIE=3 launch --nproc-per-node 4 --ps-servers 1 --ps-mode ssp --max-restarts 1 -- "$WORK/job.sh"
check "ssp: a server's death restarts the whole job" 0 "restarting the job \(1 of 1\)" \
    "rank 3 \(incarnation 0, attempt 1\) finished"

DIE=1 launch --nproc-per-node 4 --ps-servers 1 --ps-mode sync -- "$WORK/job.sh"
check "sync: a worker's death fails the job" 1 "rank 1 \(pid [0-9]+ on host .*\) was killed by signal 9"

launch --nproc-per-node 2 --ps-servers 1 --ps-mode hogwild -- true
check "an unknown --ps-mode is refused" 1 "--ps-mode 'hogwild' is not sync, ssp or async"
launch --nproc-per-node 2 --ps-servers 2 --ps-mode async -- true
check "--ps-servers that leave no worker are refused" 1 "--ps-servers 2 leaves no worker among 2 ranks"

# Over real channels: worker 1 dies mid-stream, starts again alone, finds its server through
# the store, resumes after the last message the server had, and every message arrives once.
launch --nproc-per-node 4 --ps-servers 1 --ps-mode async --max-restarts 1 -- "$RANKPROG" 60 1
check "async: a restarted worker rejoins its server over the channel" 0 \
    "rank 1 .* was killed by signal 9.*dropped" "restarting rank 1 alone as incarnation 1" \
    "server: peer 1 lost: its connection closed" "server: rank 1 rejoined as incarnation 1 after message 30" \
    "server: 3 of 3 workers done; every message came exactly once"

echo "ps_policy: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
