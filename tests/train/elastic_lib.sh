# Sourced by the elastic tests (after genesis_setup.sh and expect.sh): the job they train (dp 4 x
# ZeRO 2 on two launchers of 2 workers each), its secret, and launchers on loopback.
# Expects $port_offset (so tests running at once take other ports) and optionally
# $launcher_seconds and $join_seconds; sets $job and $port.
job=(--data "$scratch/data" --vocab 256 --context 16 --layers 2 --heads 4 --width 64
     --batch 24 --steps 12 --warmup 2 --lr 3e-3 --eval_every 6 --eval_seqs 10
     --sample_tokens 0 --threads 1 --save_every 3 --zero 2)
umask 077
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$scratch/secret"
umask 022
port=$((12000 + ($$ + port_offset) % 15000)) # below the ephemeral range
launcher_seconds=${launcher_seconds:-90}
join_seconds=${join_seconds:-30}

# node LOG NODE LAUNCH-OPTIONS... -- COMMAND...: one launcher of the job on 127.0.0.1:$port in
# the background ($! its pid), bounded in time, its output in LOG.
node() {
  local log=$1 rank=$2
  shift 2
  # (in a subshell that exits with the status, so bash does not announce a killed launcher)
  (
    timeout -k 2 "$launcher_seconds" "$meshtrain" launch --node-rank "$rank" \
      --master "127.0.0.1:$port" --secret-file "$scratch/secret" --nproc-per-node 2 \
      --join-timeout "$join_seconds" "$@" > "$log" 2>&1
    exit $?
  ) 2> /dev/null &
}
# wait_for VAR PID: waits for the launcher and sets VAR to its exit status.
wait_for() { local rc=0; wait "$2" || rc=$?; printf -v "$1" %s "$rc"; }
expect_in() { # FILE PATTERN WHAT
  grep -Eq -e "$2" "$1" || { fail "$3: no '$2' in $1"; sed 's/^/    /' "$1" | tail -n 25; }
}
# wait_line FILE PATTERN: until the line shows (at most 30 s).
wait_line() {
  for _ in $(seq 300); do grep -Eq -e "$2" "$1" 2> /dev/null && return 0; sleep 0.1; done
  fail "no '$2' in $1 within 30 s"
}
