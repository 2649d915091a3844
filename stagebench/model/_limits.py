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

from stagebench.model._json import Written, integer, number, read, text

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


@dataclass(frozen=True, slots=True)
class CpuQuota(Written):
    """The smallest CFS quota on the process's cgroup path, in CPUs (quota / period), at ``group`` (its
    path inside the hierarchy), read from ``file`` (``cpu.cfs_quota_us`` under cgroup v1, ``cpu.max``
    under v2)."""

    cpus: float
    group: str
    file: str

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CpuQuota:
        return read(cls, d, cpus=number, group=text, file=text)


@dataclass(frozen=True, slots=True)
class MemoryLimit(Written):
    """The cgroup memory limit on the process's path that leaves the least: ``limit_mb`` at ``group``, from
    ``file`` (``memory.limit_in_bytes``, ``memory.max`` or a lower ``memory.high``), and what the group
    already used when read (``used_mb``: its usage less the file pages it can drop, the working set the
    kernel cannot reclaim without killing)."""

    limit_mb: float
    group: str
    file: str
    used_mb: float = 0.0

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> MemoryLimit:
        return read(cls, d, limit_mb=number, group=text, file=text, used_mb=number)

    @property
    def free_mb(self) -> float:
        """What the limit leaves for the job now."""
        return max(0.0, self.limit_mb - self.used_mb)


@dataclass(frozen=True, slots=True)
class Throttling(Written):
    """The quota's group's ``cpu.stat`` at one moment: enforcement periods, those in which the group was
    throttled, and the time its tasks waited throttled (seconds)."""

    group: str
    periods: int | None = None
    throttled: int | None = None
    throttled_s: float | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Throttling:
        return read(cls, d, group=text, periods=integer, throttled=integer, throttled_s=number)


@dataclass(frozen=True, slots=True)
class OomCount(Written):
    """How many processes of the group the OOM killer had ended when read (``oom_kill`` of ``path``:
    ``memory.oom_control`` under cgroup v1, ``memory.events`` under v2). The rebuild of a run that never
    finished reads the same file again: a count that grew says the OOM killer ended it."""

    path: str
    kills: int

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> OomCount:
        return read(cls, d, path=text, kills=integer)


def _quota(v: Any) -> CpuQuota | None:
    return CpuQuota.from_json(v) if isinstance(v, Mapping) else None


def _memory(v: Any) -> MemoryLimit | None:
    return MemoryLimit.from_json(v) if isinstance(v, Mapping) else None


def _throttling(v: Any) -> Throttling | None:
    return Throttling.from_json(v) if isinstance(v, Mapping) else None


def _oom(v: Any) -> OomCount | None:
    return OomCount.from_json(v) if isinstance(v, Mapping) else None


@dataclass(frozen=True, slots=True)
class HostLimits(Written):
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

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> HostLimits | None:
        """The record as run.json holds it; None where there is none (a run written before it was kept)."""
        if not isinstance(d, Mapping) or number(d.get("cores")) is None:
            return None
        src, mem_src = text(d.get("cores_source")), text(d.get("memory_source"))
        return read(
            cls,
            d,
            {
                "cores_source": src if src in CORES_SOURCES else "affinity",
                "memory_source": mem_src if mem_src in MEMORY_SOURCES else "host",
            },
            cores=number,
            cpu_count=integer,
            affinity=integer,
            quota=_quota,
            slurm_cpus=integer,
            slurm_variable=text,
            memory_mb=number,
            memory_limit=_memory,
            host_available_mb=number,
            host_total_mb=number,
            shm_total_mb=number,
            shm_free_mb=number,
            throttling=_throttling,
            oom=_oom,
        )

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
