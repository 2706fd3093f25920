#!/usr/bin/env bash
# slurm-local.sh: a real Slurm cluster on this machine, for trying pprun
# under Slurm and for tests/test_slurm.c. Debian's munged, slurmctld and
# slurmd, started by hand (no systemd), each with its own key, socket,
# configuration, state, spool, logs and ports under one private directory,
# so that nothing of /etc/slurm or /etc/munge is read or changed.
#
#   scripts/slurm-local.sh start [--nodes 1|2] [--dir D] [--ports C,S]
#                                   a fresh cluster, returns once every node is idle
#   scripts/slurm-local.sh stop [--dir D]                  cancels its jobs, stops its daemons
#   scripts/slurm-local.sh status [--dir D]                exit 0 when every daemon runs; sinfo
#   eval "$(scripts/slurm-local.sh env [--dir D])"         SLURM_CONF, for sinfo, srun, sbatch, scancel
#
# D is $PPRUN_SLURM_DIR, else /tmp/pprun-slurm. C and S are slurmctld's and
# slurmd's TCP ports (default: the first two free from 16817; a caller that
# starts clusters side by side picks its own). One node: NodeName is this
# host's name, on 127.0.0.1. Two nodes: ppnode1 in this network namespace
# and ppnode2 in one of its own (ip netns, a veth pair on 10.231.X.0/24),
# each slurmd in a mount and UTS namespace of its own where the hostname is
# its node name and /etc/hosts names both nodes, as a cluster's DNS would:
# a job's processes resolve the names of SLURM_JOB_NODELIST, and see their
# own node's name. Nodes declare this machine's real CPUs and memory
# (`slurmd -C`). Processes are tracked by proctrack/linuxproc (the parent
# links in /proc): it needs no cgroup, which a container may not give.
# Logs stay in D/log until the next start; a failed start prints their end.
set -uo pipefail

die() {
  echo "slurm-local: $*" >&2
  exit 1
}

cmd=${1:-}
[ $# -gt 0 ] && shift
nodes=1
ports=
dir=${PPRUN_SLURM_DIR:-/tmp/pprun-slurm}
while [ $# -gt 0 ]; do
  case $1 in
  --nodes) nodes=${2:-}; shift 2 || die "--nodes needs 1 or 2" ;;
  --nodes=*) nodes=${1#--nodes=}; shift ;;
  --dir) dir=${2:-}; shift 2 || die "--dir needs a directory" ;;
  --dir=*) dir=${1#--dir=}; shift ;;
  --ports) ports=${2:-}; shift 2 || die "--ports needs C,S" ;;
  --ports=*) ports=${1#--ports=}; shift ;;
  *) die "unknown argument '$1'; usage: $0 start|stop|status|env [--nodes 1|2] [--dir D] [--ports C,S]" ;;
  esac
done
case $nodes in 1 | 2) ;; *) die "--nodes: '$nodes': accepted: 1 or 2" ;; esac
[[ -z "$ports" || "$ports" =~ ^[1-9][0-9]{0,4},[1-9][0-9]{0,4}$ ]] || die "--ports: '$ports': accepted: C,S (two port numbers)"
[[ "$dir" == /* ]] || die "--dir: '$dir' is not an absolute path"
dir=$(realpath -m -- "$dir") # "//", "/.", "/tmp/.." are / too
[ "$dir" != / ] || die "--dir: / is not a cluster's directory"
# `start` empties the directory (as root): only one this script made, which
# it marks, or a new or empty one.
marker=.pprun-slurm-local
conf=$dir/etc/slurm.conf
export SLURM_CONF=$conf

# The second node's names: one network namespace and veth pair per
# directory, so that clusters in two directories do not meet.
tag=$(( $(printf '%s' "$dir" | cksum | cut -d' ' -f1) % 200 + 20 ))
netns=pprun-slurm-$tag
veth_host=ppsl${tag}a
veth_node=ppsl${tag}b
subnet=10.231.$tag

# Ports that nothing on this machine listens on (TCP, IPv4 and IPv6), from
# $1 up, below the ephemeral range where srun's own listeners come from.
free_ports() {
  local from=$1 want=$2 taken p found=()
  taken=" $(cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | while read -r _ local _ st _; do
    [ "$st" = 0A ] && printf '%d ' "0x${local##*:}"
  done) "
  for ((p = from; p < from + 1000 && ${#found[@]} < want; p++)); do
    [[ "$taken" == *" $p "* ]] || found+=("$p")
  done
  [ ${#found[@]} -eq "$want" ] || return 1
  echo "${found[@]}"
}

# Alive and not a zombie (a daemon's parent is init, which may reap late).
pid_alive() {
  local stat
  [ -n "${1:-}" ] && stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}
pid_of() { [ -s "$1" ] && cat "$1" 2>/dev/null; }

# Every daemon's pid file, "name file" per line.
daemon_pids() {
  echo "munged $dir/munge/munged.pid"
  echo "slurmctld $dir/run/slurmctld.pid"
  local f
  for f in "$dir"/run/slurmd-*.pid; do [ -e "$f" ] && echo "slurmd $f"; done
}

# The last lines of every log, for a start that failed.
show_logs() {
  local f
  for f in "$dir"/munge/munged.log "$dir"/log/*.log; do
    [ -s "$f" ] || continue
    echo "--- $f (last lines)" >&2
    tail -n 15 "$f" >&2
  done
}

# Waits up to $2 seconds for pid $1 to go; SIGKILL after.
stop_pid() {
  local pid=$1 wait=$2 i
  pid_alive "$pid" || return 0
  kill -TERM "$pid" 2>/dev/null
  for ((i = 0; i < wait * 10; i++)); do
    pid_alive "$pid" || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null
}

# Processes this cluster started that outlived their daemons: slurmstepd
# (its environment is slurmd's, which has PPRUN_SLURM_CLUSTER) and the
# tasks of its jobs (SLURM_CONF of this cluster and a SLURM_JOB_ID).
leftovers() {
  {
    grep -lzxF "PPRUN_SLURM_CLUSTER=$dir" /proc/[0-9]*/environ
    grep -lzxF "SLURM_CONF=$conf" /proc/[0-9]*/environ | xargs -r grep -lz '^SLURM_JOB_ID='
  } 2>/dev/null | sed 's|^/proc/||; s|/environ$||' | sort -u | grep -vx "$$"
}

do_stop() {
  [ -f "$conf" ] || return 0
  # Jobs first, while slurmctld and slurmd can still end them properly.
  if pid_alive "$(pid_of "$dir/run/slurmctld.pid")"; then
    local jobs i
    jobs=$(timeout 10 squeue -h -o %i 2>/dev/null)
    if [ -n "$jobs" ]; then
      # shellcheck disable=SC2086
      timeout 10 scancel $jobs 2>/dev/null
      for ((i = 0; i < 150; i++)); do
        # squeue lists pending, running and completing jobs only.
        [ -z "$(timeout 10 squeue -h -o %i 2>/dev/null)" ] && break
        sleep 0.1
      done
    fi
  fi
  local name file
  while read -r name file; do
    stop_pid "$(pid_of "$file")" 10
    rm -f "$file"
  done < <(daemon_pids | sort -r) # slurmd before slurmctld before munged
  local pid
  for pid in $(leftovers); do kill -KILL "$pid" 2>/dev/null; done
  if [ -e "/run/netns/$netns" ]; then
    ip netns del "$netns" 2>/dev/null
  fi
  ip link show "$veth_host" >/dev/null 2>&1 && ip link del "$veth_host"
  return 0
}

do_status() {
  [ -f "$conf" ] || { echo "slurm-local: no cluster in $dir" >&2; return 1; }
  local name file ok=0
  while read -r name file; do
    if pid_alive "$(pid_of "$file")"; then echo "$name: running (pid $(pid_of "$file"))"
    else echo "$name: not running ($file)"; ok=1; fi
  done < <(daemon_pids)
  timeout 10 sinfo -N -o '%N %T %c %m' 2>&1 || ok=1
  return $ok
}

# The hardware line of `slurmd -C` without its NodeName: CPUs=2 Boards=1 ...
hardware() {
  slurmd -C 2>/dev/null | head -1 | tr ' ' '\n' | grep -E '^(CPUs|Boards|SocketsPerBoard|CoresPerSocket|ThreadsPerCore|RealMemory)=' | tr '\n' ' '
}

# Waits until sinfo shows every node idle.
wait_idle() {
  local i line
  for ((i = 0; i < 300; i++)); do
    line=$(timeout 10 sinfo -h -N -o '%N %T' 2>/dev/null)
    if [ -n "$line" ] && [ "$(grep -c ' idle$' <<<"$line")" -eq "$nodes" ]; then
      echo "$line"
      return 0
    fi
    sleep 0.1
  done
  echo "slurm-local: the nodes did not come up idle within 30 s; sinfo says:" >&2
  timeout 10 sinfo -N -o '%N %T %E' >&2 2>&1
  return 1
}

# The network of two nodes: a namespace for ppnode2 and a veth pair to it.
make_network() {
  command -v ip >/dev/null || die "ip (iproute2) is needed for --nodes 2"
  ip -o addr 2>/dev/null | grep -q " $subnet\." &&
    die "$subnet.0/24 is already in use on this machine (another cluster of slurm-local.sh?)"
  ip netns add "$netns" || die "cannot make a network namespace (ip netns add $netns): --nodes 2 needs CAP_SYS_ADMIN"
  if ! { ip link add "$veth_host" type veth peer name "$veth_node" &&
    ip link set "$veth_node" netns "$netns" &&
    ip addr add "$subnet.1/24" dev "$veth_host" &&
    ip link set "$veth_host" up &&
    ip -n "$netns" addr add "$subnet.2/24" dev "$veth_node" &&
    ip -n "$netns" link set "$veth_node" up &&
    ip -n "$netns" link set lo up; }; then
    die "cannot link the network namespace $netns to this one (veth $veth_host)"
  fi
}

# slurmd of node $1 (in network namespace $2, or this one when empty), in
# a mount and UTS namespace of its own: hostname $1, /etc/hosts naming both
# nodes. It daemonizes; its pid file is D/run/slurmd-$1.pid.
start_node_slurmd() {
  local node=$1 ns=$2 inner
  # shellcheck disable=SC2016
  inner='mount --bind "$1" /etc/hosts && hostname "$2" && exec slurmd -N "$2"'
  if [ -n "$ns" ]; then
    # nsenter, not `ip netns exec`, which mounts a sysfs of the namespace's
    # own over /sys and so hides /sys/fs/cgroup, where slurmd looks.
    PPRUN_SLURM_CLUSTER=$dir nsenter --net="/run/netns/$ns" unshare --mount --uts --propagation private sh -c "$inner" sh "$dir/etc/hosts" "$node"
  else
    PPRUN_SLURM_CLUSTER=$dir unshare --mount --uts --propagation private sh -c "$inner" sh "$dir/etc/hosts" "$node"
  fi
}

do_start() {
  local t
  for t in munged slurmctld slurmd sinfo squeue scancel; do
    command -v "$t" >/dev/null || die "$t not found: install the packages munge, slurmctld, slurmd and slurm-client (scripts/install-deps.sh)"
  done
  [ "$(id -u)" -eq 0 ] || die "the daemons run as root here (SlurmUser=root, and --nodes 2 makes namespaces): run as root"
  if [ -d "$dir" ] && [ ! -e "$dir/$marker" ] && [ -n "$(ls -A "$dir")" ]; then
    die "--dir $dir: not empty and not a cluster this script made (no $marker): not removing it"
  fi
  do_stop
  rm -rf "$dir"
  mkdir -p "$dir"/{munge,etc,state,spool,log,run} || die "cannot make $dir"
  : >"$dir/$marker"
  chmod 755 "$dir" "$dir/etc"
  chmod 711 "$dir/munge" # munged: its socket's directory must be searchable by all, not writable
  head -c 1024 /dev/urandom >"$dir/munge/munge.key" && chmod 400 "$dir/munge/munge.key"

  local host addr ctld_port slurmd_port hw
  host=$(hostname -s)
  [ -n "$host" ] || die "this machine has no host name (hostname -s)"
  if [ -n "$ports" ]; then
    IFS=, read -r ctld_port slurmd_port <<<"$ports"
  else
    read -r ctld_port slurmd_port <<<"$(free_ports 16817 2)" || die "no two free TCP ports from 16817 up"
  fi
  hw=$(hardware)
  [ -n "$hw" ] || die "slurmd -C printed no hardware line"
  if [ "$nodes" = 2 ]; then
    for t in unshare nsenter; do
      command -v "$t" >/dev/null || die "$t (util-linux) is needed for --nodes 2"
    done
    make_network
    addr=$subnet.1
    { cat /etc/hosts; printf '%s ppnode1\n%s ppnode2\n' "$subnet.1" "$subnet.2"; } >"$dir/etc/hosts"
  else
    addr=127.0.0.1
  fi

  cat >"$conf" <<EOF
# Written by scripts/slurm-local.sh for a cluster on this machine.
ClusterName=pprunlocal
SlurmctldHost=$host($addr)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket.2
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroup needed: parent links in /proc, no CPU binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/log/jobcomp.txt
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
ReturnToService=2
# scancel: SIGTERM, then SIGKILL after KillWait seconds.
KillWait=10
InactiveLimit=0
MinJobAge=600
EOF
  if [ "$nodes" = 2 ]; then
    echo "NodeName=ppnode1 NodeAddr=$subnet.1 $hw State=UNKNOWN" >>"$conf"
    echo "NodeName=ppnode2 NodeAddr=$subnet.2 $hw State=UNKNOWN" >>"$conf"
    mkdir -p "$dir/spool/ppnode1" "$dir/spool/ppnode2"
  else
    echo "NodeName=$host NodeAddr=127.0.0.1 $hw State=UNKNOWN" >>"$conf"
    mkdir -p "$dir/spool/$host"
  fi
  echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >>"$conf"

  # The daemons' environment marks them as this cluster's (leftovers()).
  PPRUN_SLURM_CLUSTER=$dir munged --socket="$dir/munge/munge.socket.2" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" \
    --seed-file="$dir/munge/munged.seed" </dev/null >"$dir/log/munged.out" 2>&1 ||
    { show_logs; cat "$dir/log/munged.out" >&2; die "munged did not start"; }
  PPRUN_SLURM_CLUSTER=$dir slurmctld </dev/null >"$dir/log/slurmctld.out" 2>&1 ||
    { show_logs; cat "$dir/log/slurmctld.out" >&2; do_stop; die "slurmctld did not start"; }
  if [ "$nodes" = 2 ]; then
    start_node_slurmd ppnode1 "" </dev/null >"$dir/log/slurmd.out" 2>&1 &&
      start_node_slurmd ppnode2 "$netns" </dev/null >>"$dir/log/slurmd.out" 2>&1
  else
    PPRUN_SLURM_CLUSTER=$dir slurmd -N "$host" </dev/null >"$dir/log/slurmd.out" 2>&1
  fi || { show_logs; cat "$dir/log/slurmd.out" >&2; do_stop; die "slurmd did not start"; }
  if ! wait_idle; then
    show_logs
    do_stop
    die "the cluster did not come up (logs in $dir/log)"
  fi
  echo "slurm-local: $nodes node(s) idle; export SLURM_CONF=$conf"
}

case $cmd in
start) do_start ;;
stop) do_stop ;;
status) do_status ;;
env) echo "export SLURM_CONF=$conf" ;;
*) die "usage: $0 start|stop|status|env [--nodes 1|2] [--dir D] [--ports C,S]" ;;
esac
