"""CPU, memory and disk counters of this process and its pool's worker processes.

Summing over the workers is what lets a process-pool stage show the cores they
really used. The set of processes is explicit (this process plus the worker
pids the runner reports), never a scan of /proc: while the stage's threads hold
the GIL, every /proc read costs a GIL hand-off (a convoy of milliseconds each),
so a scan of hundreds of processes both takes seconds and perturbs the very
stage being measured. RSS summed over processes counts
shared pages (the interpreter, torch) once per process, so the peak is reported
as "summed RSS" and the honest total is PSS, read once at the end of the window
(PSS reads smaps and costs milliseconds per process: too slow to poll).

Minor page faults are counted too (this process: ``getrusage``; a worker: its
``/proc/<pid>/stat``, Linux only): a fault is a page the kernel maps and
zeroes on first touch. A stage that faults in megabytes per call usually does
so because glibc's malloc hands its large temporaries back to the OS after
each call (see :mod:`stagebench.analysis._findings`), and that can cost more CPU than
the work. :func:`page_fault_cost_s` times one fault on this machine.
"""

from __future__ import annotations

import math
import mmap
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil

from stagebench.runs import _limits
from stagebench.runs._limits import usable_cores

try:
    import resource
except ImportError:  # not on Windows
    resource = None  # type: ignore[assignment]

__all__ = [
    "TreeSnapshot",
    "ResourceMonitor",
    "cpu_seconds",
    "tree_memory_mb",
    "tree_pss_mb",
    "usable_cores",
    "page_fault_cost_s",
]


_SELF: dict[int, psutil.Process] = {}


def _procs(pids: "list[int] | tuple[int, ...]") -> list[psutil.Process]:
    out = []
    me = os.getpid()
    for pid in pids:
        try:
            if pid == me:
                # Constructing a Process reads /proc: cache our own (pid reuse is
                # impossible while we are alive; a fork gets a new pid and entry).
                out.append(_SELF.get(me) or _SELF.setdefault(me, psutil.Process(me)))
            else:
                out.append(psutil.Process(pid))
        except psutil.Error:
            pass
    return out


def cpu_seconds(pids: "list[int] | tuple[int, ...]") -> float:
    """CPU seconds (user + system) these processes have used; one that is gone counts nothing."""
    total = 0.0
    for p in _procs(pids):
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


@dataclass(frozen=True, slots=True)
class TreeSnapshot:
    """Counters of a process tree at one instant, keyed by pid."""

    t: float
    cpu_s: dict[int, float]
    read_bytes: dict[int, int]
    read_chars: dict[int, int]
    minor_faults: dict[int, int]
    steal_s: float = math.nan
    """CPU seconds the hypervisor ran something else while this VM's CPUs wanted to run, all CPUs together."""
    throttled_s: float = math.nan
    """Seconds the CPU quota on this process's cgroup path held its group back so far, summed over the CPUs
    it was held back on (NaN: no quota)."""

    @classmethod
    def take(cls, worker_pids: "list[int] | tuple[int, ...]" = (), *, opening: bool = False) -> "TreeSnapshot":
        """Counters of this process (all its threads) and of ``worker_pids``.

        This process's CPU is read first, or last when ``opening`` (the snapshot that opens a
        window): either way the snapshot's own reads of /proc fall outside the span.
        """
        cpu: dict[int, float] = {}
        rb: dict[int, int] = {}
        rc: dict[int, int] = {}
        flt: dict[int, int] = {}
        me = os.getpid()
        # CLOCK_PROCESS_CPUTIME_ID: nanoseconds, a syscall and no file read. os.times() and /proc count
        # 10 ms ticks, which over a 0.2 s window read a 4 ms sleep as 10% CPU.
        if not opening:
            cpu[me], when = time.process_time(), time.perf_counter()
        for pid in (me, *worker_pids):
            n = _minor_faults(pid, me)
            if n is not None:
                flt[pid] = n
        for p in _procs([me, *worker_pids]):
            try:
                with p.oneshot():
                    if p.pid != me:
                        ct = p.cpu_times()
                        cpu[p.pid] = ct.user + ct.system
                    try:
                        io = p.io_counters()
                        rb[p.pid] = io.read_bytes
                        rc[p.pid] = getattr(io, "read_chars", io.read_bytes)
                    except (psutil.AccessDenied, AttributeError, NotImplementedError):
                        pass
            except psutil.Error:
                continue
        if opening:
            cpu[me], when = time.process_time(), time.perf_counter()
        return cls(when, cpu, rb, rc, flt, _steal_s(), _limits.throttled_s())

    @staticmethod
    def _delta(a: dict[int, float], b: dict[int, float]) -> float:
        # A worker born inside the window counts from zero; one that died inside it
        # is lost (its CPU is not attributable): the sweep records crashes anyway.
        return float(sum(v - a.get(pid, 0) for pid, v in b.items()))

    def cpu_since(self, earlier: "TreeSnapshot") -> float:
        return self._delta(earlier.cpu_s, self.cpu_s)

    def read_bytes_since(self, earlier: "TreeSnapshot") -> float:
        return self._delta(earlier.read_bytes, self.read_bytes)  # type: ignore[arg-type]

    def read_chars_since(self, earlier: "TreeSnapshot") -> float:
        return self._delta(earlier.read_chars, self.read_chars)  # type: ignore[arg-type]

    def steal_share_since(self, earlier: "TreeSnapshot") -> float:
        """The share of the CPUs' time the host took from this VM since ``earlier`` (NaN: not reported).

        A thread whose CPU is taken this way is off the CPU while the wall clock runs, which reads as
        waiting, even for a stage that never waits. Averaged over the CPUs, so it
        understates what the busy CPU lost where the others idled.
        """
        span = self.t - earlier.t
        cpus = psutil.cpu_count() or 1
        if not (span > 0 and math.isfinite(self.steal_s) and math.isfinite(earlier.steal_s)):
            return math.nan
        return max(0.0, self.steal_s - earlier.steal_s) / (cpus * span)

    def throttled_cores_since(self, earlier: "TreeSnapshot") -> float:
        """The cores' worth of time the CPU quota held the group back since ``earlier``: what the process's
        threads and workers wanted beyond the quota (0: the quota did not bind; NaN: no quota).

        Beside the cores used, it says what a curve that flattens at the quota wanted: GIL-free threads
        want a core each and are held back, threads that queue for the GIL want one between them."""
        span = self.t - earlier.t
        if not (span > 0 and math.isfinite(self.throttled_s) and math.isfinite(earlier.throttled_s)):
            return math.nan
        return max(0.0, self.throttled_s - earlier.throttled_s) / span

    def minor_faults_since(self, earlier: "TreeSnapshot") -> float:
        """Minor page faults of the tree since ``earlier``; NaN where none could be read."""
        if not self.minor_faults:
            return math.nan
        return self._delta(earlier.minor_faults, self.minor_faults)  # type: ignore[arg-type]


def _steal_s() -> float:
    """The host's steal time so far (``/proc/stat``, 10 ms ticks); NaN where the platform has none."""
    try:
        return float(getattr(psutil.cpu_times(), "steal", math.nan))
    except (psutil.Error, OSError):
        return math.nan


def _minor_faults(pid: int, me: int) -> int | None:
    """Minor page faults of a process so far (all its threads): getrusage for this one, /proc for a worker."""
    if pid == me:
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt if resource is not None else None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            # the fields after "(comm)": state ppid pgrp session tty_nr tpgid flags minflt ...
            return int(f.read().rsplit(b")", 1)[1].split()[7])
    except (OSError, ValueError, IndexError):
        return None


def page_fault_cost_s(mb: int = 32, rounds: int = 3) -> float | None:
    """CPU seconds one minor page fault costs here: the kernel maps a fresh page and zeroes it.

    Touches one byte per page of a fresh anonymous mapping, twice: the first
    pass faults every page, the second (pages mapped) is the loop's own cost,
    subtracted. The fastest of ``rounds`` (least disturbed). About 30 ms.
    None without ``getrusage`` or when nothing faulted (huge pages).
    """
    if resource is None:
        return None
    size, page = mb << 20, mmap.PAGESIZE
    best = None
    for _ in range(rounds):
        m = mmap.mmap(-1, size)
        try:
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t0 = time.thread_time()
            for off in range(0, size, page):
                m[off] = 1
            t1 = time.thread_time()
            f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            for off in range(0, size, page):
                m[off] = 2
            t2 = time.thread_time()
        finally:
            m.close()
        faults = f1 - f0
        if faults < (size // page) // 2:  # transparent huge pages: few faults, each a different cost
            continue
        cost = ((t1 - t0) - (t2 - t1)) / faults
        if cost > 0 and (best is None or cost < best):
            best = cost
    return best


def tree_memory_mb(worker_pids: "list[int] | tuple[int, ...]" = ()) -> dict[str, float]:
    """This process's and the workers' memory in MiB, each process read once.

    Returns ``main`` (our PSS), ``workers`` (the workers' summed PSS), ``pss`` (their
    sum) and ``uss``. Reading each process once matters: the main process's PSS moves
    by a page between two reads, so "total minus a second reading of main" invents
    worker memory where there are no workers.
    """
    me = os.getpid()
    out = {"main": 0.0, "workers": 0.0, "uss": 0.0}
    for p in _procs([me, *worker_pids]):
        try:
            info = p.memory_full_info()
            pss, uss = info.pss, info.uss
        except (psutil.Error, AttributeError):
            try:
                pss, uss = p.memory_info().rss, 0
            except psutil.Error:
                continue
        out["main" if p.pid == me else "workers"] += pss / 2**20
        out["uss"] += uss / 2**20
    out["pss"] = out["main"] + out["workers"]
    return out


def tree_pss_mb(worker_pids: "list[int] | tuple[int, ...]" = ()) -> float:
    """Proportional set size of this process and the workers in MiB (shared pages split)."""
    return tree_memory_mb(worker_pids)["pss"]


class ResourceMonitor:
    """Samples summed RSS of this process and the workers in a background thread; keeps the peak.

    ``worker_pids`` is called at each sample: pools start workers lazily.
    """

    def __init__(self, interval_s: float = 0.25, worker_pids: "Callable[[], list[int]] | None" = None) -> None:
        self._pids = worker_pids or (lambda: [])
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.peak_rss_mb = 0.0

    def _sample(self) -> None:
        total = 0
        for p in _procs([os.getpid(), *self._pids()]):
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        self.peak_rss_mb = max(self.peak_rss_mb, total / 2**20)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample()

    def __enter__(self) -> "ResourceMonitor":
        self._sample()
        self._thread = threading.Thread(target=self._run, name="stagebench-mem", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        self._sample()
