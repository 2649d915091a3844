"""The cores and the memory a job can use, each with where it came from (``run.json["provenance"]["limits"]``).

A container's CPU quota, a Slurm allocation or a cgroup's memory limit gives a job less than the host's
spec sheet says: the cores and the memory there are, not the host's. :class:`HostLimits` holds the one
figure for each that every label, bound, budget and pick uses, every candidate it was the smallest of,
and the counters read beside them (how often the quota throttled, how many processes the OOM killer
ended), so that the analysis can say where a limit binds and the rebuild can tell how a run ended.
:mod:`stagebench.runs._limits` reads them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stagebench.model._json import Read, ReadIfGiven, given, integer, number, text

__all__ = [
    "cpus_words",
    "CpuQuota",
    "MemoryLimit",
    "Throttling",
    "OomCount",
    "HostLimits",
    "CORES_SOURCES",
    "MEMORY_SOURCES",
]

#: Where the cores figure can come from: the affinity mask, a cgroup's CPU quota, a Slurm allocation.
CORES_SOURCES = ("affinity", "quota", "slurm")
#: Where the memory figure can come from: the host's available memory, or what a cgroup's limit leaves.
MEMORY_SOURCES = ("host", "cgroup")


def cpus_words(n: float) -> str:
    """A number of CPUs in words: ``1.0 CPU``, ``1.5 CPUs``, ``4 CPUs`` (a quota keeps its decimal)."""
    shown = f"{n:.1f}" if isinstance(n, float) else f"{n}"
    return f"{shown} CPU" + ("" if n == 1 else "s")


def _one_of(v: Any, allowed: tuple[str, ...]) -> str:
    """``v`` where it is one of ``allowed``, else the first (what a record without it reads as)."""
    t = text(v)
    return t if t in allowed else allowed[0]


@dataclass(frozen=True, slots=True)
class CpuQuota(Read):
    """The smallest CFS quota on the process's cgroup path, in CPUs (quota / period), at ``group`` (its
    path inside the hierarchy), read from ``file`` (``cpu.cfs_quota_us`` under cgroup v1, ``cpu.max``
    under v2)."""

    cpus: float
    group: str
    file: str

    READ = {"cpus": number, "group": text, "file": text}


@dataclass(frozen=True, slots=True)
class MemoryLimit(Read):
    """The cgroup memory limit on the process's path that leaves the least: ``limit_mb`` at ``group``, from
    ``file`` (``memory.limit_in_bytes``, ``memory.max`` or a lower ``memory.high``), and what the group
    already used when read (``used_mb``: its usage less the file pages it can drop, the working set the
    kernel cannot reclaim without killing)."""

    limit_mb: float
    group: str
    file: str
    used_mb: float = 0.0

    READ = {"limit_mb": number, "group": text, "file": text, "used_mb": number}

    @property
    def free_mb(self) -> float:
        """What the limit leaves for the job now."""
        return max(0.0, self.limit_mb - self.used_mb)


@dataclass(frozen=True, slots=True)
class Throttling(Read):
    """The quota's group's ``cpu.stat`` at one moment: enforcement periods, those in which the group was
    throttled, and the time its tasks waited throttled (seconds)."""

    group: str
    periods: int | None = None
    throttled: int | None = None
    throttled_s: float | None = None

    READ = {"group": text, "periods": integer, "throttled": integer, "throttled_s": number}


@dataclass(frozen=True, slots=True)
class OomCount(Read):
    """How many processes of the group the OOM killer had ended when read (``oom_kill`` of ``path``:
    ``memory.oom_control`` under cgroup v1, ``memory.events`` under v2). The rebuild of a run that never
    finished reads the same file again: a count that grew says the OOM killer ended it."""

    path: str
    kills: int

    READ = {"path": text, "kills": integer}


@dataclass(frozen=True, slots=True)
class HostLimits(ReadIfGiven):
    """The cores and the memory this job can use, and where each came from.

    ``cores`` is the smallest of the affinity mask (``affinity``), the CFS quota on the process's cgroup
    path (``quota``) and the Slurm allocation (``slurm_cpus``, from ``slurm_variable``); a tie goes to
    the affinity, then Slurm. It is a count where the affinity or Slurm sets it, and can be a fraction
    (1.5) where a quota does. ``memory_mb`` is the smaller of the host's available memory and what the
    cgroup limit leaves (``memory_limit``); ``memory_source`` says which. ``throttling`` and ``oom`` are
    counters read at the same moment, to be compared with a later reading."""

    cores: float
    cores_source: str = "affinity"
    cpu_count: int | None = None
    affinity: int | None = None
    quota: CpuQuota | None = None
    slurm_cpus: int | None = None
    slurm_variable: str | None = None
    memory_mb: float | None = None
    memory_source: str = "host"
    memory_limit: MemoryLimit | None = None
    host_available_mb: float | None = None
    host_total_mb: float | None = None
    shm_total_mb: float | None = None
    shm_free_mb: float | None = None
    throttling: Throttling | None = None
    oom: OomCount | None = None

    def __post_init__(self) -> None:
        if self.cores_source not in CORES_SOURCES:
            raise ValueError(f"cores_source: unknown {self.cores_source!r}; allowed: {', '.join(CORES_SOURCES)}")
        if self.memory_source not in MEMORY_SOURCES:
            raise ValueError(f"memory_source: unknown {self.memory_source!r}; allowed: {', '.join(MEMORY_SOURCES)}")

    READ = {
        "cores": number,
        "cores_source": lambda v: _one_of(v, CORES_SOURCES),
        "cpu_count": integer,
        "affinity": integer,
        "quota": given(CpuQuota.from_json),
        "slurm_cpus": integer,
        "slurm_variable": text,
        "memory_mb": number,
        "memory_source": lambda v: _one_of(v, MEMORY_SOURCES),
        "memory_limit": given(MemoryLimit.from_json),
        **dict.fromkeys(("host_available_mb", "host_total_mb", "shm_total_mb", "shm_free_mb"), number),
        "throttling": given(Throttling.from_json),
        "oom": given(OomCount.from_json),
    }

    @classmethod
    def holds(cls, d: Mapping[str, Any]) -> bool:
        """A record holds the cores (a run written before it was kept holds none)."""
        return number(d.get("cores")) is not None

    @property
    def of(self) -> int | None:
        """The cores the process could otherwise run on: its affinity mask, else the host's count."""
        return self.affinity if self.affinity is not None else self.cpu_count

    def cores_bound(self) -> str:
        """Where a quota or an allocation sets the cores, in words ("1.0 CPU by the container's quota, of
        2"); empty where the affinity mask does (then every word stays as without a limit)."""
        if self.cores_source == "affinity":
            return ""
        of = f", of {self.of}" if self.of is not None else ""
        if self.cores_source == "quota" and self.quota is not None:
            return f"{cpus_words(self.cores)} by the container's quota{of}"
        return f"{cpus_words(self.cores)} by the Slurm allocation ({self.slurm_variable}){of}"

    def cores_origin(self) -> str:
        """Where the cores figure came from, always in words (the report's provenance shows it)."""
        bound = self.cores_bound()
        if bound and self.quota is not None and self.cores_source == "quota":
            return f"{bound}: {self.quota.file} of cgroup {self.quota.group}"
        if bound:
            return bound
        return "the affinity mask" + ("" if self.quota is None else f"; a CPU quota of {cpus_words(self.quota.cpus)}")

    def memory_bound(self) -> str:
        """Where a cgroup's limit sets the memory, in words ("1,521 MB the container's memory limit leaves
        (2,344 MB, 823 MB used)"); empty where the host's available memory does."""
        lim = self.memory_limit
        if self.memory_source != "cgroup" or lim is None or self.memory_mb is None:
            return ""
        return (
            f"{self.memory_mb:,.0f} MB the container's memory limit leaves ({lim.limit_mb:,.0f} MB, "
            f"{lim.used_mb:,.0f} MB used)"
        )
