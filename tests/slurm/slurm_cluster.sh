# Sourced by the Slurm tests: a private Slurm cluster on this host (munged, slurmctld and one
# slurmd, or two slurmd in network+UTS namespaces), everything in a scratch folder, stopped by pid.
# Set scratch and skip first. slurm_start [two]: starts the cluster, exports SLURM_CONF and waits
# until every node is idle; exits $skip (saying why) when Slurm is not installed. The caller's
# EXIT trap must call slurm_stop. slurm_nodes says how many nodes came up (1, or 2 in two mode).
# slurm_cpus (set it first to change it) is the CPUs each node declares: 8 by default, more than
# this host may have (SlurmdParameters=config_overrides), so srun -n 8 fits on one node; a
# benchmark sets the host's real count. TaskPlugin=task/none: Slurm binds no task to any CPU.
slurm_pids=()
slurm_netns=()
slurm_bridge=
slurm_nodes=0

slurm_log() { echo "slurm_cluster: $*" >&2; }

# Ports that no other cluster on this host uses: a pair picked from this shell's pid, below the
# 20000-29999 that meshtrain derives from job ids (which start at a random FirstJobId, so two
# runs of the test rarely meet the same port).
slurm_ports() {
  local base=$((16000 + ($$ % 1000) * 2))
  ctld_port=$base
  slurmd_port=$((base + 1))
}

slurm_write_conf() {
  local dir=$1 nodes_lines=$2 node_names=$3
  mkdir -p "$dir/state" "$dir/log"
  local n
  for n in "$ctld_name" mtnode1 mtnode2; do mkdir -p "$dir/spool/$n"; done
  cat > "$dir/slurm.conf" <<EOF
ClusterName=mtest
FirstJobId=$((1000 + RANDOM % 8000))
SlurmctldHost=$ctld_name($ctld_addr)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge.sock
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
MailProg=/bin/true
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=30
$nodes_lines
PartitionName=debug Nodes=$node_names Default=YES MaxTime=INFINITE State=UP
EOF
}

# Runs in the background and records the pid for slurm_stop.
slurm_spawn() {
  local log=$1; shift
  "$@" >> "$SLURM_SCRATCH/log/$log" 2>&1 &
  slurm_pids+=($!)
}

slurm_start_munge() {
  local dir=$1
  dd if=/dev/urandom of="$dir/munge.key" bs=1024 count=1 status=none
  chmod 0400 "$dir/munge.key"
  # --force: root, and a scratch folder under a world-writable /tmp, are fine for a test.
  slurm_spawn munged.out munged --foreground --force --key-file="$dir/munge.key" \
    --socket="$dir/munge.sock" --pid-file="$dir/munged.pid" --seed-file="$dir/munge.seed" \
    --log-file="$dir/log/munged.log" --num-threads=2
  local i
  for i in $(seq 50); do
    [ -S "$dir/munge.sock" ] && return 0
    sleep 0.1
  done
  slurm_log "munged did not come up"; cat "$dir/log/munged.log" >&2; return 1
}

# Waits until sinfo reports this many nodes idle.
slurm_wait_idle() {
  local want=$1 i states= pid
  for i in $(seq 150); do
    for pid in "${slurm_pids[@]}"; do
      kill -0 "$pid" 2> /dev/null || { slurm_log "a daemon (pid $pid) has ended"; break 2; }
    done
    states=$(sinfo -h -N -o '%t' 2>/dev/null | sort | uniq -c | tr -s ' ')
    [ "$(sinfo -h -N -t idle -o '%N' 2> /dev/null | sort -u | wc -l)" = "$want" ] && return 0
    sleep 0.2
  done
  slurm_log "the nodes are not idle: $states"
  tail -n 20 "$SLURM_SCRATCH"/log/*.log >&2
  return 1
}

slurm_start() {
  local mode=${1:-one}
  if ! command -v slurmctld > /dev/null || ! command -v slurmd > /dev/null ||
     ! command -v munged > /dev/null || ! command -v sbatch > /dev/null; then
    echo "SKIPPED: Slurm is not installed (apt-get install slurm-wlm munge; scripts/deps.sh test)" >&2
    exit "$skip"
  fi
  SLURM_SCRATCH="$scratch/slurm"
  mkdir -p "$SLURM_SCRATCH/log"
  chmod 0711 "$SLURM_SCRATCH"
  slurm_ports
  export SLURM_CONF="$SLURM_SCRATCH/slurm.conf"
  slurm_start_munge "$SLURM_SCRATCH" || return 1
  if [ "$mode" = two ]; then
    slurm_two_nodes && return 0
    slurm_log "two nodes in namespaces did not come up: one node"
    slurm_stop
    mv "$SLURM_SCRATCH" "$SLURM_SCRATCH.two"
    mkdir -p "$SLURM_SCRATCH/log"
    chmod 0711 "$SLURM_SCRATCH"
    slurm_start_munge "$SLURM_SCRATCH" || return 1
  fi
  ctld_name=$(hostname -s)
  ctld_addr=127.0.0.1
  slurm_write_conf "$SLURM_SCRATCH" \
    "NodeName=$ctld_name NodeAddr=127.0.0.1 CPUs=${slurm_cpus:-8} RealMemory=1000 State=UNKNOWN" "$ctld_name"
  slurm_spawn slurmctld.out slurmctld -D -c -f "$SLURM_CONF"
  slurm_spawn slurmd.out slurmd -D -N "$ctld_name" -f "$SLURM_CONF"
  slurm_nodes=1
  slurm_wait_idle 1
}

# Two nodes: a bridge on this host (the controller's side) and one network and UTS namespace
# per slurmd, named mtnode1 and mtnode2, each with a private /etc/hosts (a mount namespace)
# that names the nodes. Returns 1 (one node mode then) where namespaces cannot be made.
slurm_two_nodes() {
  local tag="mts$(($$ % 10000))" sub="10.$((200 + $$ % 50)).$(($$ % 250))"
  ip link add "${tag}br" type bridge 2> /dev/null || { slurm_log "no bridge here: one node"; return 1; }
  slurm_bridge="${tag}br"
  ip addr add "$sub.1/24" dev "$slurm_bridge"
  ip link set "$slurm_bridge" up
  local hosts="$SLURM_SCRATCH/hosts" n
  printf '127.0.0.1 localhost\n%s.1 mtctl\n%s.2 mtnode1\n%s.3 mtnode2\n' "$sub" "$sub" "$sub" > "$hosts"
  for n in 1 2; do
    local ns="${tag}n$n"
    ip netns add "$ns" || return 1
    slurm_netns+=("$ns")
    ip link add "${tag}v$n" type veth peer name "${tag}p$n"
    ip link set "${tag}v$n" master "$slurm_bridge"
    ip link set "${tag}v$n" up
    ip link set "${tag}p$n" netns "$ns"
    ip -n "$ns" addr add "$sub.$((n + 1))/24" dev "${tag}p$n"
    ip -n "$ns" link set lo up
    ip -n "$ns" link set "${tag}p$n" up
  done
  ctld_name=$(hostname -s)
  ctld_addr="$sub.1"
  slurm_write_conf "$SLURM_SCRATCH" \
    "NodeName=mtnode[1-2] NodeAddr=$sub.[2-3] CPUs=${slurm_cpus:-8} RealMemory=1000 State=UNKNOWN" \
    "mtnode[1-2]"
  slurm_spawn slurmctld.out slurmctld -D -c -f "$SLURM_CONF"
  for n in 1 2; do
    slurm_spawn "slurmd$n.out" nsenter --net="/run/netns/${tag}n$n" unshare --uts --mount --propagation private \
      sh -c 'hostname "$1" && mount --bind "$2" /etc/hosts && exec slurmd -D -N "$1" -f "$3"' \
      sh "mtnode$n" "$hosts" "$SLURM_CONF"
  done
  slurm_nodes=2
  slurm_wait_idle 2
}

# Stops what slurm_start started, by pid: the daemons first (slurmd ends its job steps), then
# munged, then the namespaces.
slurm_stop() {
  local i pid
  if [ ${#slurm_pids[@]} -gt 0 ]; then
    squeue -h -o %i 2> /dev/null | xargs -r scancel 2> /dev/null || true
  fi
  for ((i = ${#slurm_pids[@]} - 1; i >= 0; i--)); do
    pid=${slurm_pids[$i]}
    kill -TERM "$pid" 2> /dev/null || true
  done
  for pid in "${slurm_pids[@]}"; do
    for i in $(seq 50); do
      kill -0 "$pid" 2> /dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2> /dev/null || true
    wait "$pid" 2> /dev/null || true
  done
  slurm_pids=()
  for ns in "${slurm_netns[@]}"; do
    ip netns del "$ns" 2> /dev/null || true
  done
  slurm_netns=()
  [ -n "$slurm_bridge" ] && ip link del "$slurm_bridge" 2> /dev/null
  slurm_bridge=
  return 0
}
