"""What a measurement was taken on: machine, interpreter, libraries, knobs, load.

A throughput figure without its machine is not a claim anyone can check. Every
run directory stores this next to its rows; comparisons warn when runs differ.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import socket
import sys
import sysconfig
from collections.abc import Mapping
from importlib import metadata

import psutil

from stagebench._settings import SettingsError
from stagebench.model._limits import HostLimits
from stagebench.runs._limits import read_limits, throttling_warning
from stagebench.runs._ranks import ranks_from_env

__all__ = ["collect_provenance", "load_warnings", "is_free_threaded"]

_ENV_KNOBS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "PYTHON_GIL",
    "SPDL_PIPELINE_DIAGNOSTIC_MODE",
    "SPDL_PIPELINE_DIAGNOSTIC_MODE_NUM_ITEMS",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "WORLD_SIZE",
    "TORCHELASTIC_RUN_ID",
    "SLURM_JOB_ID",
    "SLURM_JOB_PARTITION",
    "SLURM_CPUS_PER_TASK",
    "SLURM_CPUS_ON_NODE",
    "SLURM_JOB_NODELIST",
    "SLURM_CLUSTER_NAME",
    # the array ids link a run to submitit's .submitit/<A>_<i> logs
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "SUBMITIT_EXECUTOR",
)
_LIBRARIES = ("stagebench", "spdl", "spdl_core", "spdl_io", "torch", "numpy", "pandas", "joblib", "loky", "hydra-core")


def is_free_threaded() -> bool:
    """True on a free-threaded (no-GIL) CPython build with the GIL actually off."""
    built = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
    gil_check = getattr(sys, "_is_gil_enabled", None)
    return built and (gil_check is None or not gil_check())


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def collect_provenance(env_as_given: Mapping[str, str | None] | None = None) -> dict:
    """A JSON-ready description of this machine and process, taken now. ``env_as_given``: variables the
    caller changed for the run, with the values the user gave them (None: unset), recorded in their place
    (the diagnostic mode, which a diagnosis sets to 0 for its pool workers and SPDL's loader's pipeline)."""
    env = {k: os.environ.get(k) for k in _ENV_KNOBS if k in os.environ}
    for k, v in (env_as_given or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    vm = psutil.virtual_memory()
    try:
        affinity = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        affinity = list(range(os.cpu_count() or 1))
    # the cores and memory the job has (a quota, a memory limit, Slurm), each with where it came from
    limits = read_limits(affinity=len(affinity))
    return {
        "taken_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": affinity,
        "usable_cores": limits.cores,
        "memory_total_gb": round(vm.total / 2**30, 2),
        "memory_available_gb": round(vm.available / 2**30, 2),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "free_threaded": is_free_threaded(),
        "libraries": {name: _version(name) for name in _LIBRARIES},
        "env": env,
        "load_avg": list(os.getloadavg()),
        "ranks": _ranks(),
        "limits": limits.to_json(),
    }


def _ranks() -> dict | None:
    """The data-parallel job's ranks as the launcher set them (None: a rank variable that reads as none:
    the diagnosis refused it before any run was made)."""
    try:
        return ranks_from_env().to_json()
    except SettingsError:
        return None


def load_warnings(before: dict, after: dict | None = None) -> list[str]:
    """Warnings when the machine looked busy around the measurement.

    The 1-minute load average counts runnable tasks, including ours; a load
    above half the usable cores before we started means someone else was busy.
    The load is the host's, not a container's: under a CPU quota it is set against the cores the process
    could run on (its affinity mask), not the quota's. A CPU quota that throttled the run between the two
    readings is named too.
    """
    out = []
    limits = HostLimits.from_json(before.get("limits"))
    cores = (limits.of if limits is not None else None) or before.get("usable_cores") or 1
    la0 = before.get("load_avg", [0.0])[0]
    if la0 > 0.5 * cores:
        out.append(
            f"the machine was busy before the run (1-min load {la0:.2f} on {cores} cores): "
            "timings may be low and intervals wide"
        )
    if after is not None and before.get("hostname") != after.get("hostname"):
        out.append("the run moved between machines")
    elif after is not None:
        throttled = throttling_warning(limits, HostLimits.from_json(after.get("limits")))
        if throttled:
            out.append(throttled)
    return out
