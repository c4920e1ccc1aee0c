#!/usr/bin/env bash
# slurm-cluster.sh - mldist's throw-away, single-host Slurm cluster for the test suite.
#
# usage: bash scripts/slurm-cluster.sh start|stop|status|kill-node I|revive-node I|freeze-node I|thaw-node I
#   start   idempotent; installs the Debian packages if missing, starts a private munged,
#           slurmctld and N emulated nodes (slurmd -N node1..nodeN on 127.0.0.1), waits until
#           every node is idle. The last stdout line is exactly: export SLURM_CONF=<path>
#           MPI: srun speaks PMIx by default (MpiDefault=pmix, Debian's libpmix2 and libpmix-dev,
#           installed before slurmd starts), so a PyPI Open MPI + mpi4py forms one world across
#           the nodes; each node gets its own TmpFS ($MLDIST_SLURM_DIR/tmp/nodeI), where Slurm's
#           PMIx plugin puts the job's client directory (two nodes on one host would share it).
#   stop    stops only the daemons this script started (its pid files) and removes the
#           /etc/hosts lines and /etc/slurm/slurm.conf symlink it created
#   status  exit 0 and print sinfo if the cluster is up, exit 1 if not
#   kill-node I    lose node I as a machine is lost: SIGKILL its slurmd, its job steps
#                  (slurmstepd) and everything they started; the controller notices when the
#                  node stops answering (SlurmdTimeout)
#   revive-node I  start node I's slurmd again; it returns to service (ReturnToService=2)
#   freeze-node I  hang node I as a frozen machine hangs: SIGSTOP its slurmd, its job steps and
#                  everything they started (no connection closes; nothing answers)
#   thaw-node I    SIGCONT them again (after freeze-node I)
#
# Knobs (environment):
#   MLDIST_SLURM_DIR          config/state/logs/pids              [/tmp/mldist-slurm]
#   MLDIST_SLURM_NODES        number of emulated nodes; most tests use 2, the
#                             elastic test loses a fourth and a third [4]
#   MLDIST_SLURM_PORT         slurmctld port; slurmd use PORT+10000+i [6917]
#   MLDIST_SLURM_CPUS         CPUs advertised per node             [2]
#   MLDIST_SLURM_CRED_EXPIRE  AuthInfo cred_expire (s); a requeued job waits about this
#                             long before it may start again (Slurm default 120, min 5) [5]
#
# Tested on Debian 12 (slurm-wlm 22.05.8, built with MULTIPLE_SLURMD), as root.
set -euo pipefail

readonly ME="slurm-cluster.sh"
readonly MARK="# mldist-slurm-cluster"   # tags the /etc/hosts lines we add
readonly ETC_LINK="/etc/slurm/slurm.conf"

D="${MLDIST_SLURM_DIR:-/tmp/mldist-slurm}"
NODES="${MLDIST_SLURM_NODES:-4}"
PORT="${MLDIST_SLURM_PORT:-6917}"
CPUS="${MLDIST_SLURM_CPUS:-2}"
CRED_EXPIRE="${MLDIST_SLURM_CRED_EXPIRE:-5}"
CONF="$D/etc/slurm.conf"
export SLURM_CONF="$CONF"

log() { echo "[$ME] $*" >&2; }
die() { echo "[$ME] ERROR: $*" >&2; exit 1; }
usage() { echo "usage: bash scripts/$ME start|stop|status|kill-node I|revive-node I|freeze-node I|thaw-node I" >&2; }

check_knobs() {
  case "$D" in /*) ;; *) die "MLDIST_SLURM_DIR must be an absolute path (got '$D')" ;; esac
  [[ "$NODES" =~ ^[1-9][0-9]?$ ]] || die "MLDIST_SLURM_NODES must be 1..99 (got '$NODES')"
  [[ "$CPUS" =~ ^[1-9][0-9]*$ ]] || die "MLDIST_SLURM_CPUS must be a positive integer (got '$CPUS')"
  if ! [[ "$CRED_EXPIRE" =~ ^[0-9]+$ ]] || [ "$CRED_EXPIRE" -lt 5 ]; then
    die "MLDIST_SLURM_CRED_EXPIRE must be an integer >= 5 (got '$CRED_EXPIRE')"
  fi
  if ! [[ "$PORT" =~ ^[0-9]+$ ]] || [ "$PORT" -lt 1024 ] || [ "$((PORT + 10000 + NODES))" -gt 65535 ]; then
    die "MLDIST_SLURM_PORT must be an integer in 1024..$((65535 - 10000 - NODES)) (got '$PORT')"
  fi
}

need_root() { [ "$(id -u)" -eq 0 ] || die "must run as root (it starts munged/slurmctld/slurmd and edits /etc/hosts)"; }

# running PID -> 0 if PID exists and is not a zombie (a dead daemon stays a zombie until
# init reaps it, which can take a while in containers)
running() { [ -r "/proc/$1/status" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null; }

# alive PIDFILE COMM -> 0 if the pid file names a live process with that command name
alive() {
  local pf="$1" comm="$2" pid
  [ -s "$pf" ] || return 1
  pid="$(cat "$pf" 2>/dev/null)" || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] && running "$pid" && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$comm" ]
}

# count_nodes REGEX -> number of our nodes whose sinfo state matches REGEX
count_nodes() {
  local out
  out="$(timeout 5 sinfo -h -N -o '%N %t' 2>/dev/null)" || { echo 0; return 0; }
  printf '%s\n' "$out" | grep -cE " ($1)\$" || true
}
all_idle() { [ "$(count_nodes 'idle')" -eq "$NODES" ]; }
all_up() { [ "$(count_nodes 'idle|mix|alloc|comp')" -eq "$NODES" ]; }
# A cluster of an older version of this script (no PMIx) counts as down: start replaces it.
is_up() { [ -f "$CONF" ] && grep -q "^MpiDefault=pmix" "$CONF" && alive "$D/run/slurmctld.pid" slurmctld && all_up; }

# stop_pids COMM PIDFILE...: SIGTERM every pid file's process that is alive and named COMM,
# wait for all of them together, SIGKILL what is left after 10 s
stop_pids() {
  local comm="$1" pf pid pids=()
  shift
  for pf in "$@"; do
    if alive "$pf" "$comm"; then
      pid="$(cat "$pf")"
      log "stopping $comm (pid $pid)"
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid")
    fi
    rm -f "$pf"
  done
  local left
  for _ in $(seq 1 100); do
    left=0
    for pid in ${pids[@]+"${pids[@]}"}; do running "$pid" && left=1; done
    [ "$left" -eq 0 ] && return 0
    sleep 0.1
  done
  for pid in ${pids[@]+"${pids[@]}"}; do
    if running "$pid" && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$comm" ]; then
      log "$comm $pid still alive after 10s, SIGKILL"; kill -KILL "$pid" 2>/dev/null || true
    fi
  done
}

# cancel_jobs: cancel every job still in our cluster and wait (<= 20 s) until none runs,
# so no job steps outlive the daemons
cancel_jobs() {
  local ids=()
  alive "$D/run/slurmctld.pid" slurmctld || return 0
  mapfile -t ids < <(timeout 5 squeue -h -o %i 2>/dev/null || true)
  [ "${#ids[@]}" -gt 0 ] || return 0
  log "cancelling ${#ids[@]} job(s) still in the cluster"
  timeout 10 scancel "${ids[@]}" 2>/dev/null || true
  for _ in $(seq 1 100); do
    [ -z "$(timeout 5 squeue -h -t RUNNING,COMPLETING,SUSPENDED,CONFIGURING -o %i 2>/dev/null)" ] && return 0
    sleep 0.2
  done
}

# kill_orphan_steps [LOG]: SIGKILL slurmstepd processes of our nodes (they hold our slurmd log
# open; with LOG, only those holding that node's log) and all their descendants, e.g. left
# over when the daemons died with jobs running
kill_orphan_steps() {  # kill_orphan_steps [LOG-PREFIX [SIGNAL]]: SIGKILL (or SIGNAL) to those steps' trees
  local p pid fd victims=() queue=() child want="${1:-$D/log/}" sig="${2:-KILL}"
  for p in /proc/[0-9]*; do
    [ "$(cat "$p/comm" 2>/dev/null)" = slurmstepd ] || continue
    for fd in "$p"/fd/*; do
      if [[ "$(readlink "$fd" 2>/dev/null)" == "$want"* ]]; then queue+=("${p#/proc/}"); break; fi
    done
  done
  while [ "${#queue[@]}" -gt 0 ]; do
    pid="${queue[0]}"; queue=("${queue[@]:1}"); victims+=("$pid")
    for child in $(ps -o pid= --ppid "$pid" 2>/dev/null); do queue+=("$child"); done
  done
  [ "${#victims[@]}" -gt 0 ] || return 0
  log "SIG$sig to ${#victims[@]} job-step process(es): ${victims[*]}"
  kill "-$sig" "${victims[@]}" 2>/dev/null || true
}

stop_all() {
  local pfs=()
  cancel_jobs
  shopt -s nullglob
  pfs=("$D"/run/slurmd-*.pid)
  shopt -u nullglob
  stop_pids slurmd ${pfs[@]+"${pfs[@]}"}   # nodes first, then controller, then munge
  stop_pids slurmctld "$D/run/slurmctld.pid"
  stop_pids munged "$D/run/munged.pid"
  kill_orphan_steps
  # what we added outside $D (only if it is still ours)
  if [ -e "$D/run/etc-link-created" ]; then
    if [ -L "$ETC_LINK" ] && [ "$(readlink "$ETC_LINK")" = "$CONF" ]; then rm -f "$ETC_LINK"; fi
    rm -f "$D/run/etc-link-created"
  fi
  {  # /etc/hosts: one editor at a time across the project's scripts (test-hosts.sh edits it too)
    flock -w 60 8 || die "timed out waiting for /tmp/mldist-etc-hosts.lock"
    if grep -qF "$MARK" /etc/hosts 2>/dev/null; then
      # rewrite in place (keeps the inode; /etc/hosts may be a bind mount)
      grep -vF "$MARK" /etc/hosts > "$D/run/hosts.tmp" || true
      cat "$D/run/hosts.tmp" > /etc/hosts
      rm -f "$D/run/hosts.tmp"
    fi
  } 8> /tmp/mldist-etc-hosts.lock
}

install_packages() {
  local c missing=0
  for c in slurmctld slurmd sinfo srun sbatch scontrol munged munge unmunge; do
    command -v "$c" >/dev/null 2>&1 || missing=1
  done
  has_pmix || missing=1
  [ "$missing" -eq 0 ] && return 0
  log "installing slurmctld slurmd slurm-client munge libpmix2 libpmix-dev"
  local t0=$SECONDS apt_log="$D/apt.log"
  export DEBIAN_FRONTEND=noninteractive
  # One apt at a time across the project's scripts (the suite starts services side by side).
  if ! flock -w 900 /tmp/mldist-apt.lock apt-get update -qq > "$apt_log" 2>&1; then
    tail -n 5 "$apt_log" >&2; die "apt-get update failed; cannot install the Slurm packages (log: $apt_log)"
  fi
  # libpmix-dev: Slurm's mpi/pmix plugin opens the unversioned libpmix.so, which only the -dev
  # package links ("can not load PMIx library" without it).
  if ! flock -w 900 /tmp/mldist-apt.lock apt-get install -y -qq --no-install-recommends slurmctld slurmd \
    slurm-client munge libpmix2 libpmix-dev >> "$apt_log" 2>&1; then
    tail -n 5 "$apt_log" >&2; die "apt-get install slurmctld slurmd slurm-client munge libpmix2 libpmix-dev failed (log: $apt_log)"
  fi
  # (on a systemd host the packages also enable their own services; we never use them)
  log "packages installed in $((SECONDS - t0))s"
  for c in slurmctld slurmd sinfo srun sbatch scontrol munged munge unmunge; do
    command -v "$c" >/dev/null 2>&1 || die "'$c' still missing after installing packages"
  done
  has_pmix || die "libpmix.so still missing after installing libpmix-dev"
}

# has_pmix -> 0 if the unversioned PMIx library that Slurm's mpi/pmix plugin loads is installed
has_pmix() { ldconfig -p 2>/dev/null | grep -q 'libpmix\.so '; }

write_config() {
  local host mem_mb i
  host="$(hostname -s)"
  # the emulated nodes share this machine's RAM: give each 70% / NODES of it
  mem_mb=$(($(awk '/^MemTotal:/{print $2}' /proc/meminfo) * 7 / 10 / 1024 / NODES))
  [ "$mem_mb" -ge 100 ] || mem_mb=100
  cat > "$CONF" <<EOF
# generated by mldist scripts/$ME - throw-away test cluster, do not edit
ClusterName=mldist
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire also sets how long a requeued job waits before it may start again
AuthInfo=socket=$D/munge/munge.sock,cred_expire=$CRED_EXPIRE
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/slurmd-%n
SlurmctldPidFile=$D/run/slurmctld.pid
SlurmdPidFile=$D/run/slurmd-%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$D/etc/plugstack.conf
# srun starts MPI ranks through PMIx (srun --mpi=pmi2 or none to opt out); TmpFS per node: the
# PMIx plugin puts each step's client directory there, and the nodes share this host's /tmp.
MpiDefault=pmix
TmpFS=$D/tmp/%n
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# A requeued job gets BeginTime = requeue time + cred_expire + 1; once that passes, only a
# scheduler pass starts it. Backfill (bf_interval) skips passes when nothing changed, so
# without a short sched_interval (default 60 s) it waits for the next node ping (~10 s).
SchedulerParameters=batch_sched_delay=0,bf_interval=1,sched_interval=2
JobRequeue=1
MailProg=/bin/true
ReturnToService=2
SlurmdParameters=config_overrides
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=600
KillWait=5
OverTimeLimit=0
Waittime=0
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
  for i in $(seq 1 "$NODES"); do
    echo "NodeName=node$i NodeHostname=$host NodeAddr=127.0.0.1 Port=$((PORT + 10000 + i)) CPUs=$CPUS Sockets=1 CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=$mem_mb State=UNKNOWN" >> "$CONF"
  done
  : > "$D/etc/plugstack.conf"   # keep the host's /etc/slurm/plugstack.conf out of our jobs
}

start_munge() {
  [ -s "$D/munge/munge.key" ] || dd if=/dev/urandom of="$D/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$D/munge/munge.key"
  munged --socket="$D/munge/munge.sock" --key-file="$D/munge/munge.key" \
    --pid-file="$D/run/munged.pid" --log-file="$D/log/munged.log" \
    --seed-file="$D/munge/munged.seed" 9>&- || die "munged failed to start (see $D/log/munged.log)"
  munge -S "$D/munge/munge.sock" -n | unmunge -S "$D/munge/munge.sock" >/dev/null ||
    die "munge self-test failed (see $D/log/munged.log)"
}

cmd_start() {
  need_root
  mkdir -p "$D/run"
  exec 9> "$D/run/lock"
  flock -w 180 9 || die "timed out waiting for another '$ME' to finish"

  if is_up; then
    log "already running (SLURM_CONF=$CONF)"
    echo "export SLURM_CONF=$CONF"
    return 0
  fi

  install_packages
  local t0
  t0="$(date +%s.%N)"
  stop_all 2>/dev/null   # leftovers of an earlier, broken run of this script
  rm -rf "${D:?}/state" "${D:?}/spool" "${D:?}/log" "${D:?}/etc" "${D:?}/tmp"
  mkdir -p "$D/etc" "$D/state" "$D/spool" "$D/log" "$D/run" "$D/munge"
  for i in $(seq 1 "$NODES"); do mkdir -p "$D/tmp/node$i"; chmod 1777 "$D/tmp/node$i"; done
  chmod 755 "$D" "$D/munge"
  write_config
  start_munge

  local i
  # emulated node names must resolve for tools that connect to $SLURM_STEP_NODELIST hosts
  {
    flock -w 60 8 || die "timed out waiting for /tmp/mldist-etc-hosts.lock"
    for i in $(seq 1 "$NODES"); do
      getent hosts "node$i" >/dev/null || echo "127.0.0.1 node$i $MARK" >> /etc/hosts
    done
  } 8> /tmp/mldist-etc-hosts.lock
  # let plain `sbatch` etc. work without SLURM_CONF, but never clobber someone else's file
  mkdir -p /etc/slurm
  if [ ! -e "$ETC_LINK" ] && [ ! -L "$ETC_LINK" ]; then
    ln -s "$CONF" "$ETC_LINK" && touch "$D/run/etc-link-created"
  elif [ "$(readlink "$ETC_LINK" 2>/dev/null)" = "$CONF" ]; then
    touch "$D/run/etc-link-created"
  else
    log "$ETC_LINK exists and is not ours; use SLURM_CONF=$CONF"
  fi

  # daemons fork into the background and write their own pid files (fd 9 = our lock: not theirs)
  slurmctld -i -f "$CONF" 9>&- || { stop_all; die "slurmctld failed to start (see $D/log/slurmctld.log)"; }
  for i in $(seq 1 "$NODES"); do
    slurmd -N "node$i" -f "$CONF" 9>&- || { stop_all; die "slurmd node$i failed to start (see $D/log/slurmd-node$i.log)"; }
  done

  for _ in $(seq 1 300); do all_idle && break; sleep 0.2; done
  if ! all_idle; then
    log "nodes not idle after 60s:"
    timeout 5 sinfo -N >&2 || true
    tail -n 20 "$D"/log/*.log >&2 || true
    stop_all
    die "cluster did not come up (logs kept in $D/log)"
  fi
  log "cluster up in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')s ($NODES nodes x $CPUS CPUs, port $PORT, dir $D)"
  timeout 5 sinfo -N >&2 || true
  echo "export SLURM_CONF=$CONF"
}

cmd_stop() {
  need_root
  if [ -d "$D/run" ]; then
    exec 9> "$D/run/lock"
    flock -w 180 9 || die "timed out waiting for another '$ME' to finish"
  fi
  stop_all
  log "stopped"
}

# node_index I -> exits with a message unless I names one of the cluster's nodes
node_index() {
  [[ "${1:-}" =~ ^[1-9][0-9]?$ ]] && [ "$1" -le "$NODES" ] || die "expected a node number 1..$NODES (got '${1:-}')"
}

cmd_kill_node() {
  need_root
  node_index "$1"
  local pf="$D/run/slurmd-node$1.pid"
  if alive "$pf" slurmd; then kill -KILL "$(cat "$pf")"; fi
  kill_orphan_steps "$D/log/slurmd-node$1.log"
  log "node$1 lost: its slurmd and job steps were killed"
}

cmd_freeze_node() {  # cmd_freeze_node I STOP|CONT
  need_root
  node_index "$1"
  local pf="$D/run/slurmd-node$1.pid"
  alive "$pf" slurmd || die "node$1's slurmd does not run"
  [ "$2" = STOP ] && kill -STOP "$(cat "$pf")"
  kill_orphan_steps "$D/log/slurmd-node$1.log" "$2"
  [ "$2" = CONT ] && kill -CONT "$(cat "$pf")"
  log "node$1 $([ "$2" = STOP ] && echo frozen || echo thawed): its slurmd and job steps got SIG$2"
}

cmd_revive_node() {
  need_root
  node_index "$1"
  alive "$D/run/slurmd-node$1.pid" slurmd || slurmd -N "node$1" -f "$CONF" 9>&- || die "slurmd node$1 failed to start"
  for _ in $(seq 1 300); do
    [ "$(timeout 5 sinfo -h -N -n "node$1" -o %t 2>/dev/null)" = idle ] && { log "node$1 is back"; return 0; }
    sleep 0.2
  done
  die "node$1 did not return to idle in 60 s (see $D/log/slurmd-node$1.log)"
}

cmd_status() {
  if is_up; then
    sinfo
    return 0
  fi
  echo "[$ME] not running (dir $D)" >&2
  return 1
}

main() {
  local usage_line="usage: bash scripts/$ME start|stop|status|kill-node I|revive-node I|freeze-node I|thaw-node I"
  case "${1:-}" in
    kill-node | revive-node | freeze-node | thaw-node) [ "$#" -eq 2 ] || { echo "[$ME] $1 takes a node number ($usage_line)" >&2; exit 2; } ;;
    *) [ "$#" -eq 1 ] || { echo "[$ME] expected one sub-command ($usage_line)" >&2; exit 2; } ;;
  esac
  case "$1" in
    kill-node) check_knobs; cmd_kill_node "$2" ;;
    revive-node) check_knobs; cmd_revive_node "$2" ;;
    freeze-node) check_knobs; cmd_freeze_node "$2" STOP ;;
    thaw-node) check_knobs; cmd_freeze_node "$2" CONT ;;
    start) check_knobs; cmd_start ;;
    stop) check_knobs; cmd_stop ;;
    status) check_knobs; cmd_status ;;
    -h | --help | help) usage; exit 0 ;;
    *) echo "[$ME] unknown sub-command '$1' ($usage_line)" >&2; exit 2 ;;
  esac
}

main "$@"
