"""Read the cores and the memory this job can use from the process's own cgroup, its affinity and Slurm.

No well-kept library reads a child group's quota (docs/method.md#the-cores-and-the-memory-the-job-has).
This module reads the groups themselves, the process's own and every parent up to its hierarchy's mount,
found through ``/proc/self/cgroup`` and ``/proc/self/mountinfo``:

* **cores**: cgroup v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` under the ``cpu`` controller's mount
  (a quota of -1 is none); v2 ``cpu.max`` (``"max 100000"`` is none) under the unified mount. A quota at
  any level caps the whole subtree, so the smallest along the path is the job's. Slurm's allocation:
  ``SLURM_CPUS_PER_TASK`` (what this task was given, set by ``--cpus-per-task``) wins, else
  ``SLURM_CPUS_ON_NODE`` (what the job holds on this node), read only inside a job (``SLURM_JOB_ID``):
  with ``TaskPlugin=task/none`` Slurm sets no affinity mask, and these are then all that says it.
* **memory**: v1 ``memory.limit_in_bytes`` (the "no limit" value, near 2**63, reads as none); v2
  ``memory.max``, and ``memory.high`` where lower (above it the kernel throttles the group hard). Each
  group's limit less what it already uses (``memory.usage_in_bytes`` / ``memory.current`` less the
  inactive file pages of its ``memory.stat``, which the kernel drops before it kills); the group that
  leaves the least binds, and its room is set beside the host's available memory (psutil).
* **counters**: the quota's group's ``cpu.stat`` (``nr_throttled``, and ``throttled_time`` in ns under v1,
  ``throttled_usec`` under v2) and the own group's ``oom_kill`` count (v1 ``memory.oom_control``, v2
  ``memory.events``), to compare with a later reading.

A file that is missing or unreadable, or holds what does not parse, is "no limit known": never an error.
Every reader takes ``root`` (the file system's root, ``/``) so that tests can point it at a fixture tree.
"""

from __future__ import annotations

import functools
import math
import os
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

from stagebench.model._limits import CpuQuota, HostLimits, MemoryLimit, OomCount, Throttling, cpus_words
from stagebench.model._meta import RunEnd

__all__ = [
    "read_limits",
    "usable_cores",
    "job_memory_mb",
    "read_oom_kills",
    "throttling_warning",
    "throttled_s",
    "how_it_ended",
    "cpu_quota",
    "memory_limit",
    "slurm_cpus",
    "SLURM_CPU_VARIABLES",
    "NO_LIMIT_BYTES",
]

#: Slurm's variables for the CPUs of this process, the first that is set wins (module docstring).
SLURM_CPU_VARIABLES = ("SLURM_CPUS_PER_TASK", "SLURM_CPUS_ON_NODE")
#: A v1 memory limit at or above this many bytes is the kernel's "no limit" (PAGE_COUNTER_MAX pages,
#: 9223372036854771712 on x86-64): no host has 2**60 bytes.
NO_LIMIT_BYTES = 1 << 60


@dataclass(frozen=True, slots=True)
class _Group:
    """One cgroup directory on the process's path: its path inside the hierarchy and where it is here."""

    name: str
    dir: Path
    version: int


def _text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace")
    except (OSError, ValueError):
        return None


def _int(s: str | None) -> int | None:
    try:
        return int(s.strip()) if s is not None else None
    except ValueError:
        return None


def _keyed(path: Path) -> dict[str, int]:
    """A flat-keyed file (``cpu.stat``, ``memory.stat``, ``memory.events``, ``memory.oom_control``) as numbers."""
    out: dict[str, int] = {}
    for line in (_text(path) or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and (v := _int(parts[1])) is not None:
            out[parts[0]] = v
    return out


def _own_paths(root: Path) -> tuple[dict[str, str], str | None]:
    """``/proc/self/cgroup``: the process's path in each v1 hierarchy, by controller; and its v2 path."""
    v1: dict[str, str] = {}
    v2: str | None = None
    for line in (_text(root / "proc/self/cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if hid == "0" and controllers == "":
            v2 = path
        for c in controllers.split(","):
            if c:
                v1[c] = path
    return v1, v2


def _mounts(root: Path) -> Iterator[tuple[str, Path, str, set[str]]]:
    """``/proc/self/mountinfo``'s cgroup mounts: (the hierarchy's path at the mount, where it is mounted here,
    the file system type, its options)."""
    for line in (_text(root / "proc/self/mountinfo") or "").splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        # mount points escape spaces and the like as octal (\040)
        point = fields[4].encode().decode("unicode_escape")
        yield fields[3], root / point.lstrip("/"), tail[0], set(tail[2].split(","))


def _cgroup_dirs(root: Path | str, controller: str) -> list[_Group]:
    """The process's own group and every parent up to the mount, for ``controller`` (``cpu``, ``memory``):
    its v1 hierarchy, and the unified (v2) one. Own group first; [] where neither is mounted."""
    root = Path(root)
    v1, v2 = _own_paths(root)
    out: list[_Group] = []
    for mount_root, point, fstype, options in _mounts(root):
        if fstype == "cgroup" and controller in options and controller in v1:
            path, version = v1[controller], 1
        elif fstype == "cgroup2" and v2 is not None:
            path, version = v2, 2
        else:
            continue
        # inside a cgroup namespace or a container's bind mount, the mount shows the hierarchy from
        # mount_root down: the process's path is read relative to it
        rel = path
        if mount_root != "/" and (path == mount_root or path.startswith(mount_root.rstrip("/") + "/")):
            rel = path[len(mount_root.rstrip("/")) :] or "/"
        parts = [p for p in rel.split("/") if p]
        if not (point / "/".join(parts)).is_dir():
            parts = []  # the path is not visible here (another namespace): the mount's own group is all there is
        for i in range(len(parts), -1, -1):
            out.append(_Group("/" + "/".join(parts[:i]), point.joinpath(*parts[:i]), version))
    return out


def cpu_quota(root: Path | str = "/") -> CpuQuota | None:
    """The smallest CFS quota on the process's cgroup path, in CPUs; None where no group has one."""
    best: CpuQuota | None = None
    for g in _cgroup_dirs(root, "cpu"):
        if g.version == 1:
            quota, period = _int(_text(g.dir / "cpu.cfs_quota_us")), _int(_text(g.dir / "cpu.cfs_period_us"))
            file = "cpu.cfs_quota_us"
        else:
            words = (_text(g.dir / "cpu.max") or "").split()
            quota = _int(words[0]) if len(words) == 2 and words[0] != "max" else None
            period, file = _int(words[1]) if len(words) == 2 else None, "cpu.max"
        if quota is None or period is None or quota <= 0 or period <= 0:
            continue
        cpus = round(quota / period, 3)
        if best is None or cpus < best.cpus:
            best = CpuQuota(cpus=cpus, group=g.name, file=file)
    return best


def _quota_stat_path(root: Path | str, quota: CpuQuota | None) -> Path | None:
    """The ``cpu.stat`` of the group the quota was read at (None without a quota)."""
    if quota is None:
        return None
    for g in _cgroup_dirs(root, "cpu"):
        if g.name == quota.group and (g.version == 2) == (quota.file == "cpu.max"):
            return g.dir / "cpu.stat"
    return None


def _throttled_s(stat: Mapping[str, int]) -> float | None:
    """Throttled seconds from a ``cpu.stat``: v1 ``throttled_time`` (ns), v2 ``throttled_usec``."""
    ns, us = stat.get("throttled_time"), stat.get("throttled_usec")
    return ns / 1e9 if ns is not None else us / 1e6 if us is not None else None


def _throttling(root: Path | str, quota: CpuQuota | None) -> Throttling | None:
    """The quota's group's ``cpu.stat`` now (None without a quota, or where it cannot be read)."""
    path = _quota_stat_path(root, quota)
    stat = _keyed(path) if path is not None else {}
    if quota is None or not stat:
        return None
    return Throttling(
        group=quota.group,
        periods=stat.get("nr_periods"),
        throttled=stat.get("nr_throttled"),
        throttled_s=_throttled_s(stat),
    )


@functools.cache
def _quota_stat() -> Path | None:
    """The ``cpu.stat`` of the group whose quota binds this process, found once (a process does not move
    between groups while it measures); None without a quota."""
    return _quota_stat_path("/", cpu_quota("/"))


def throttled_s() -> float:
    """Seconds the CPU quota on this process's path has held its group back so far (v1 ``throttled_time``,
    v2 ``throttled_usec``); NaN without a quota or where it cannot be read. One small file read: the
    measurement reads it at each window's edges."""
    path = _quota_stat()
    got = _throttled_s(_keyed(path)) if path is not None else None
    return math.nan if got is None else got


def _limit_bytes(g: _Group) -> tuple[int, str] | None:
    """The group's own memory limit in bytes and the file it came from; None where it has none."""
    if g.version == 1:
        v = _int(_text(g.dir / "memory.limit_in_bytes"))
        return (v, "memory.limit_in_bytes") if v is not None and 0 < v < NO_LIMIT_BYTES else None
    found = [
        (v, f)
        for f in ("memory.max", "memory.high")
        if (v := _int(_text(g.dir / f))) is not None and v > 0  # "max" does not parse: no limit
    ]
    return min(found) if found else None


def _used_bytes(g: _Group) -> int:
    """The group's memory in use, less the inactive file pages the kernel drops before it kills."""
    if g.version == 1:
        used = _int(_text(g.dir / "memory.usage_in_bytes")) or 0
        inactive = _keyed(g.dir / "memory.stat").get("total_inactive_file", 0)
    else:
        used = _int(_text(g.dir / "memory.current")) or 0
        inactive = _keyed(g.dir / "memory.stat").get("inactive_file", 0)
    return max(0, used - inactive)


def memory_limit(root: Path | str = "/") -> MemoryLimit | None:
    """The cgroup memory limit on the process's path that leaves the least; None where no group has one."""
    best: MemoryLimit | None = None
    for g in _cgroup_dirs(root, "memory"):
        got = _limit_bytes(g)
        if got is None:
            continue
        limit, file = got
        lim = MemoryLimit(limit_mb=limit / 2**20, group=g.name, file=file, used_mb=_used_bytes(g) / 2**20)
        if best is None or lim.free_mb < best.free_mb:
            best = lim
    return best


def read_oom_kills(path: str | Path) -> int | None:
    """The ``oom_kill`` count of a ``memory.oom_control`` or ``memory.events`` file; None where it cannot be read."""
    return _keyed(Path(path)).get("oom_kill")


def _oom(root: Path | str) -> OomCount | None:
    """The process's own memory group's OOM kills so far (the first on its path that counts them)."""
    groups = _cgroup_dirs(root, "memory")
    # the own group of each hierarchy (v1 first: where both are mounted, the v1 one holds the controller)
    for g in [next((g for g in groups if g.version == v), None) for v in (1, 2)]:
        if g is None:
            continue
        path = g.dir / ("memory.oom_control" if g.version == 1 else "memory.events")
        kills = read_oom_kills(path)
        if kills is not None:
            return OomCount(path=str(path), kills=kills)
    return None


def throttling_warning(before: HostLimits | None, after: HostLimits | None) -> str | None:
    """The warning where the quota throttled the job between two readings, as the CPU-speed warning names a
    host that changed speed: a throttled period is one in which the group used its quota and waited for
    the next, so a point that wanted more CPUs than the quota ran at the quota's pace. None where nothing
    was throttled, or the counters cannot be compared (no quota, another group, not read)."""
    a = before.throttling if before is not None else None
    b = after.throttling if after is not None else None
    if a is None or b is None or a.group != b.group or a.throttled is None or b.throttled is None:
        return None
    n = b.throttled - a.throttled
    if n <= 0:
        return None
    periods = (b.periods - a.periods) if b.periods is not None and a.periods is not None else None
    waited = (b.throttled_s - a.throttled_s) if b.throttled_s is not None and a.throttled_s is not None else None
    quota = before.quota if before is not None else None
    what = f"the container's CPU quota ({cpus_words(quota.cpus)}, cgroup {quota.group})" if quota else "the CPU quota"
    return (
        f"{what} throttled the run in {n:,} "
        + (f"of {periods:,} " if periods else "")
        + "scheduling periods"
        + (f" ({waited:,.1f} s waiting for the next)" if waited is not None else "")
        + ": a setting that wanted more CPUs than the quota ran at the quota's pace; a curve that flattens "
        "there is the quota, not the GIL"
    )


def how_it_ended(limits: HostLimits | None) -> RunEnd:
    """How a run that never finished ended, read now: the OOM killer where its cgroup's ``oom_kill`` count
    (recorded at the start, :class:`~stagebench.model._limits.OomCount`) has grown since; else that it ended
    without finishing and nothing here says why. The group must still exist (the rebuild runs where the
    run ran): a count that cannot be read shows nothing."""
    oom = limits.oom if limits is not None else None
    now = read_oom_kills(oom.path) if oom is not None else None
    if oom is not None and now is not None and now > oom.kills:
        lim = limits.memory_limit if limits is not None else None
        at = (
            f" at its cgroup's memory limit ({lim.limit_mb:,.0f} MB, {lim.file} of {lim.group})"
            if lim is not None
            else ""
        )
        return RunEnd(
            text=f"killed by the OOM killer{at}: its cgroup's oom_kill count went from {oom.kills} to {now} "
            f"({oom.path}); the rows measured before are kept",
            by="oom",
            oom_kills=(oom.kills, now),
        )
    return RunEnd(
        text="it ended without finishing, and its cgroup shows no OOM kill: killed by a signal (SIGKILL, a "
        "scheduler's limit), the machine went down, or it is still running; the rows measured before are kept"
    )


def slurm_cpus(env: Mapping[str, str]) -> tuple[int, str] | None:
    """The CPUs Slurm allocated this process, and the variable that says so (module docstring); None
    outside a job or where the variable is no count."""
    if not env.get("SLURM_JOB_ID"):
        return None
    for var in SLURM_CPU_VARIABLES:
        n = _int(env.get(var))
        if n is not None and n > 0:
            return n, var
    return None


def _affinity() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _cores(
    root: Path | str, env: Mapping[str, str], affinity: int
) -> tuple[float, str, CpuQuota | None, tuple[int, str] | None]:
    quota, slurm = cpu_quota(root), slurm_cpus(env)
    cores: float = affinity
    source = "affinity"
    if slurm is not None and slurm[0] < cores:
        cores, source = slurm[0], "slurm"
    if quota is not None and quota.cpus < cores:
        cores, source = quota.cpus, "quota"
    return cores, source, quota, slurm


def usable_cores(root: Path | str = "/", env: Mapping[str, str] | None = None, affinity: int | None = None) -> float:
    """The cores this job can use: the smallest of the affinity mask, the quota and Slurm's allocation
    (an int where the affinity or Slurm sets it, a fraction where a quota does)."""
    return _cores(root, os.environ if env is None else env, _affinity() if affinity is None else affinity)[0]


def _shm(root: Path) -> tuple[float | None, float | None]:
    try:
        u = shutil.disk_usage(root / "dev/shm")
    except OSError:
        return None, None
    return u.total / 2**20, u.free / 2**20


def job_memory_mb(limits: HostLimits | None = None, root: Path | str = "/") -> float:
    """The memory this job can use now, in MB: what the cgroup limit leaves, where it leaves less than the
    host has available, else the host's available memory. ``limits``: a reading already made."""
    lim = limits if limits is not None else read_limits(root)
    return math.inf if lim.memory_mb is None else float(lim.memory_mb)


def read_limits(
    root: Path | str = "/", *, env: Mapping[str, str] | None = None, affinity: int | None = None
) -> HostLimits:
    """The cores and the memory this job can use now, with every candidate and where each came from.

    ``root``, ``env`` and ``affinity`` are for tests (a fixture tree, a Slurm job's variables, a mask);
    the host's memory is psutil's either way."""
    root = Path(root)
    aff = _affinity() if affinity is None else affinity
    cores, source, quota, slurm = _cores(root, os.environ if env is None else env, aff)
    vm = psutil.virtual_memory()
    host_mb = vm.available / 2**20
    mem = memory_limit(root)
    room = host_mb if mem is None else min(host_mb, mem.free_mb)
    shm_total, shm_free = _shm(root)
    return HostLimits(
        cores=cores,
        cores_source=source,
        cpu_count=os.cpu_count(),
        affinity=aff,
        quota=quota,
        slurm_cpus=None if slurm is None else slurm[0],
        slurm_variable=None if slurm is None else slurm[1],
        memory_mb=room,
        memory_source="cgroup" if mem is not None and mem.free_mb < host_mb else "host",
        memory_limit=mem,
        host_available_mb=host_mb,
        host_total_mb=vm.total / 2**20,
        shm_total_mb=shm_total,
        shm_free_mb=shm_free,
        throttling=_throttling(root, quota),
        oom=_oom(root),
    )
