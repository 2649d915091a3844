#!/usr/bin/env bash
# Start a one-node Slurm cluster on this machine (for stagebench's cluster tests,
# or to try `stagebench sweep -m hydra/launcher=submitit_slurm ...` on one box).
#
# What it does, each step only if needed (running it twice does nothing the
# second time):
#   1. installs Debian's slurm-wlm and munge (one `apt-get update`; root only);
#   2. creates /etc/munge/munge.key and starts munged (as user munge);
#   3. writes slurm.conf into a state folder that does not depend on any checkout
#      ($STAGEBENCH_SLURM_DIR, default /tmp/stagebench-slurm), with this machine's
#      hostname, CPU layout and memory as `slurmd -C` reports them, one default
#      partition `local`, no accounting, no cgroup.conf (Slurm 22.05's slurmd does
#      not start with `CgroupPlugin=disabled`, and cgroups are not needed here);
#   4. starts slurmctld and slurmd and waits until `sinfo` shows the node idle.
# The daemons are left running: idle, they cost nothing, and the next run (or a
# second CI run on a fresh clone) reuses them. tests/cluster/stop_slurm.sh stops them.
#
# Clients find this cluster through SLURM_CONF:
#     export SLURM_CONF=/tmp/stagebench-slurm/slurm.conf
#
# Exit status: 0 running; 3 this machine cannot run it (not root, no apt-get,
# packages missing); 1 a start failed (the reason and the log tail on stderr).
set -uo pipefail

STATE=${STAGEBENCH_SLURM_DIR:-/tmp/stagebench-slurm}
CONF=$STATE/slurm.conf
PARTITION=local
NODE=$(hostname -s)

say() { echo "start_slurm: $*" >&2; }
cannot() { echo "start_slurm: cannot run Slurm here: $*" >&2; exit 3; }
fail() {
  echo "start_slurm: failed: $*" >&2
  for log in "$STATE"/slurmctld.log "$STATE"/slurmd.log; do
    [ -s "$log" ] && { echo "--- last lines of $log" >&2; tail -n 15 "$log" >&2; }
  done
  exit 1
}

export SLURM_CONF=$CONF

node_state() { sinfo -h -n "$NODE" -o %T 2>/dev/null | head -n 1; }
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# slurm.conf for this machine, into $CONF.new. `slurmd -C` prints this node's real
# layout; a NodeName line that claims more than the hardware has leaves the node
# drained ("Low socket*core*thread count").
render_conf() {
  hw=$(slurmd -C 2>/dev/null | head -n 1) || true
  case "$hw" in NodeName=*) ;; *) echo "slurmd -C did not report this node's layout: $hw" >&2; return 1 ;; esac
  layout=$(echo "$hw" | tr ' ' '\n' | grep -E '^(CPUs|Boards|SocketsPerBoard|CoresPerSocket|ThreadsPerCore|RealMemory)=' | tr '\n' ' ')
  cat >"$CONF".new <<EOF
# Written by stagebench tests/cluster/start_slurm.sh: a one-node cluster on localhost.
ClusterName=stagebench
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
# A node that was down (machine restarted, daemon killed) rejoins when slurmd registers.
ReturnToService=2
# Seconds between SIGTERM and SIGKILL for a cancelled job (default 30). submitit's job
# process ignores SIGTERM, so a cancelled job ends only at SIGKILL: keep tests short.
KillWait=5
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
NodeName=$NODE NodeAddr=127.0.0.1 $layout State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
}

# Already up: nothing to do (the common case after the first run).
if [ -f "$CONF" ] && command -v sinfo >/dev/null && command -v slurmd >/dev/null; then
  case "$(node_state)" in
    idle|mixed|allocated|completing)
      if render_conf 2>/dev/null && cmp -s "$CONF".new "$CONF"; then
        rm -f "$CONF".new
        say "already running (node $NODE $(node_state)); SLURM_CONF=$CONF"
        exit 0
      fi ;;
  esac
fi

[ "$(id -u)" = 0 ] || cannot "not root (the daemons and the munge key need root; uid $(id -u))"

# 1. packages
need=()
command -v slurmctld >/dev/null || need+=(slurmctld)
command -v slurmd >/dev/null || need+=(slurmd)
command -v sinfo >/dev/null || need+=(slurm-client)
command -v munged >/dev/null || need+=(munge)
if [ ${#need[@]} -gt 0 ]; then
  command -v apt-get >/dev/null || cannot "no apt-get to install ${need[*]}"
  say "installing ${need[*]} (slurm-wlm, munge) with apt-get"
  apt-get update -qq >/dev/null 2>&1 || cannot "apt-get update failed (no network or no package mirror)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge \
    >"${TMPDIR:-/tmp}/stagebench-slurm-apt.log" 2>&1 \
    || cannot "apt-get install slurm-wlm munge failed (see ${TMPDIR:-/tmp}/stagebench-slurm-apt.log)"
  for b in slurmctld slurmd sinfo munged; do
    command -v "$b" >/dev/null || cannot "$b is still missing after installing slurm-wlm and munge"
  done
fi

# 2. munge: Slurm authenticates every message with it.
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  if [ ! -s /etc/munge/munge.key ]; then
    say "creating /etc/munge/munge.key"
    install -d -o munge -g munge -m 700 /etc/munge
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    chown munge:munge /etc/munge/munge.key
    chmod 400 /etc/munge/munge.key
  fi
  install -d -o munge -g munge -m 755 /run/munge
  install -d -o munge -g munge -m 700 /var/log/munge /var/lib/munge
  say "starting munged"
  runuser -u munge -- /usr/sbin/munged || fail "munged did not start (see /var/log/munge/munged.log)"
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  munge -n | unmunge >/dev/null 2>&1 || fail "munge credentials do not round-trip (munge -n | unmunge)"
fi

# 3. slurm.conf (rewritten only when it changed)
mkdir -p "$STATE"/ctld "$STATE"/d
render_conf || fail "cannot write slurm.conf"
changed=0
if ! cmp -s "$CONF".new "$CONF"; then mv "$CONF".new "$CONF"; changed=1; else rm -f "$CONF".new; fi

# 4. daemons
ctld_was_up=0
alive "$STATE"/slurmctld.pid && ctld_was_up=1
if [ "$ctld_was_up" = 0 ]; then
  say "starting slurmctld"
  slurmctld -f "$CONF" || fail "slurmctld did not start"
fi
if ! alive "$STATE"/slurmd.pid; then
  say "starting slurmd"
  slurmd -f "$CONF" || fail "slurmd did not start"
fi
if [ "$changed" = 1 ] && [ "$ctld_was_up" = 1 ]; then
  # Daemons started from an older slurm.conf (an older version of this script): re-read it.
  say "slurm.conf changed; scontrol reconfigure"
  scontrol reconfigure || fail "scontrol reconfigure failed"
fi

resumed=0
for _ in $(seq 60); do
  s=$(node_state)
  case "$s" in
    idle|mixed|allocated|completing)
      say "running: node $NODE $s, partition $PARTITION; export SLURM_CONF=$CONF"
      exit 0 ;;
    drain*|down*)
      # Left drained or down by an earlier run whose slurmd was killed mid-job.
      if [ "$resumed" = 0 ]; then
        say "node $NODE is $s ($(sinfo -h -n "$NODE" -o %E)); resuming it"
        scontrol update nodename="$NODE" state=resume >/dev/null 2>&1 || true
        resumed=1
      fi ;;
  esac
  sleep 0.5
done
fail "node $NODE did not become idle within 30 s (state '${s:-none}'; sinfo -R: $(sinfo -h -R 2>&1 | head -n 1))"
