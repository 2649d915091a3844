#!/usr/bin/env bash
# Stop the one-node Slurm that start_slurm.sh started (by its pid files only).
# munged is left running: other software on the machine may use it.
set -uo pipefail
STATE=${STAGEBENCH_SLURM_DIR:-/tmp/stagebench-slurm}
for d in slurmd slurmctld; do
  pidfile=$STATE/$d.pid
  if [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    kill "$(cat "$pidfile")" && echo "stop_slurm: stopped $d" >&2
  fi
done
