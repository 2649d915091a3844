"""Known-answer stage functions for tests: work whose GIL share is known by construction.

Every stage here is a small picklable callable object, so the same instance runs
on threads, on the event loop (the async ones) and in worker processes. The
amount of work is fixed when the object is built, in the parent process:

- CPU work is a **fixed loop count**, never "spin until the clock has advanced
  by g ms". A wall-clock spin finishes on time even while it waits for the GIL
  (the clock runs while it is descheduled), so it would look GIL-free on
  threads. A fixed amount of bytecode can only finish when it has held the GIL
  long enough to execute.
- The loop count (and the hash size of :class:`HashCPU`) is calibrated **once
  per process**, by the fastest of several short trials: the fastest trial is
  the one least disturbed by other load on a shared machine, so ``spin(g)`` is
  g ms of uncontended work. Worker processes never recalibrate; they receive
  the count inside the pickled object.

Per-item time is t = g (GIL held) + r (GIL released: sleeping, or C code that
drops the GIL), so the GIL fraction of :class:`SpinSleep` is g / (g + r).
Threads then reach about ``min(c / t, 1 / g, cores / cpu_per_item)`` items/s.

Use::

    from _stages import SpinSleep, Sleep, Spin, HashCPU, AsyncSleep
    stage = SpinSleep(spin_ms=0.8, sleep_ms=3.2)   # GIL fraction 0.2
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import time
from dataclasses import dataclass, field

__all__ = [
    "Calibration",
    "calibrate",
    "spin_loops",
    "Spin",
    "Sleep",
    "SpinSleep",
    "SpinSleepProbe",
    "HashCPU",
    "HashPieces",
    "read_releases",
    "AsyncSleep",
    "AsyncSpinSleep",
]

# Short trials (about 1 ms each): on a busy machine the scheduler preempts us
# every few milliseconds, and only a trial shorter than a time slice can run
# undisturbed. Many trials make it likely that at least one did.
_TRIAL_LOOPS = 20_000
_TRIAL_HASH_BYTES = 1 << 20


def spin_loops(n: int) -> int:
    """Pure-Python work that holds the GIL for all of it: ``n`` loop iterations."""
    x = 0
    for i in range(n):
        x += i
    return x


@dataclass(frozen=True, slots=True)
class Calibration:
    """How much fixed work takes one millisecond on this machine (uncontended)."""

    loops_per_ms: float
    hash_bytes_per_ms: float


def _fastest(fn, trials: int) -> float:
    best = float("inf")
    for _ in range(trials):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


@functools.cache
def calibrate(trials: int = 40) -> Calibration:
    """Calibrate once per process (cached): the fastest of ``trials`` short runs."""
    spin_s = _fastest(lambda: spin_loops(_TRIAL_LOOPS), trials)
    buf = bytes(_TRIAL_HASH_BYTES)
    hash_s = _fastest(lambda: hashlib.sha256(buf).digest(), trials)
    return Calibration(
        loops_per_ms=_TRIAL_LOOPS / (spin_s * 1e3),
        hash_bytes_per_ms=_TRIAL_HASH_BYTES / (hash_s * 1e3),
    )


@dataclass(frozen=True, slots=True)
class Spin:
    """Hold the GIL for ``ms`` milliseconds of pure-Python work (GIL fraction 1)."""

    ms: float
    loops: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "loops", int(round(self.ms * calibrate().loops_per_ms)))

    def __call__(self, item):
        spin_loops(self.loops)
        return item


@dataclass(frozen=True, slots=True)
class Sleep:
    """Wait ``ms`` milliseconds with the GIL released (GIL fraction 0, no CPU)."""

    ms: float

    def __call__(self, item):
        time.sleep(self.ms / 1e3)
        return item


@dataclass(frozen=True, slots=True)
class SpinSleep:
    """Spin ``spin_ms`` (GIL held) then sleep ``sleep_ms``: GIL fraction spin / (spin + sleep)."""

    spin_ms: float
    sleep_ms: float
    loops: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "loops", int(round(self.spin_ms * calibrate().loops_per_ms)))

    @property
    def gil_fraction(self) -> float:
        return self.spin_ms / (self.spin_ms + self.sleep_ms)

    def __call__(self, item):
        spin_loops(self.loops)
        if self.sleep_ms > 0:
            time.sleep(self.sleep_ms / 1e3)
        return item


class SpinSleepProbe:
    """A SpinSleep that also times its own spin and sleep (ground truth, threads only).

    On a busy machine the spin stretches (descheduled while holding the GIL) and
    the sleep overshoots (waking needs a free core), so the share of time the
    stage really held the GIL drifts from the nominal g / (g + r). The probe
    measures what actually happened, call by call, so that the truth can be read
    over the calls the measurement's window counted: the warm-up's calls come
    first and can run in another phase of the host (a fresh-clone run read a held
    share of 0.45 over all calls where the window's own calls held 0.55).
    """

    def __init__(self, stage: SpinSleep) -> None:
        self.stage = stage
        # per call: spin wall time, the spin's own CPU time (below its wall time when the
        # core was taken away), the call's wall time
        self.calls: list[tuple[float, float, float]] = []

    def __call__(self, item):
        t0, c0 = time.perf_counter(), time.thread_time()
        spin_loops(self.stage.loops)
        t1, c1 = time.perf_counter(), time.thread_time()
        if self.stage.sleep_ms > 0:
            time.sleep(self.stage.sleep_ms / 1e3)
        self.calls.append((t1 - t0, c1 - c0, time.perf_counter() - t0))
        return item

    def last(self, n: float) -> tuple[float, float, float]:
        """(spin s, spin CPU s, total s) over the last ``n`` calls: a window ends the measurement."""
        tail = self.calls[-max(1, int(round(n))) :]
        return (sum(c[0] for c in tail), sum(c[1] for c in tail), sum(c[2] for c in tail))


# Each process builds the buffer once; only its size travels in the pickle.
_HASH_BUFFERS: dict[int, bytes] = {}


def _hash_buffer(nbytes: int) -> bytes:
    """A zero buffer of ``nbytes``, made once per size (per process)."""
    buf = _HASH_BUFFERS.get(nbytes)
    if buf is None:
        buf = _HASH_BUFFERS.setdefault(nbytes, bytes(nbytes))
    return buf


@dataclass(frozen=True, slots=True)
class HashCPU:
    """``ms`` milliseconds of CPU in hashlib, which releases the GIL for large buffers.

    CPU-bound but (almost) GIL-free: threads scale to the cores like processes.
    """

    ms: float
    nbytes: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nbytes", max(4096, int(self.ms * calibrate().hash_bytes_per_ms)))

    def __call__(self, item):
        buf = _hash_buffer(self.nbytes)
        hashlib.sha256(buf).digest()
        return item


@dataclass(frozen=True, slots=True)
class HashPieces:
    """``ms`` milliseconds of hashlib CPU in ``k`` hashes a call: it lets the GIL go ``k`` times (numpy-like)."""

    ms: float
    k: int
    nbytes: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nbytes", max(4096, int(self.ms / self.k * calibrate().hash_bytes_per_ms)))

    def __call__(self, item):
        buf = _hash_buffer(self.nbytes)
        for _ in range(self.k):
            hashlib.sha256(buf).digest()
        return item


def read_releases(fn, probes: int = 3) -> float:
    """The GIL probe's count of ``fn``'s releases per call: the median of ``probes`` probes.

    One probe's count is a lower bound whose tail is long: it sees a release
    only where its spinner wakes and takes the GIL before the stage takes it
    back. Forty probes of twelve 0.25 ms hashes read 6.5-9.8 (median 7.5) on a
    quiet 2-core VM, and two full-suite runs read 5.1 and 6.0. The median of
    three keeps one probe's bad moment out of a known-answer check. Skips the
    test where the probe could not read the count, or the machine took its
    spinner's core (a release shorter than the spinner's wait to run goes unseen).
    """
    import statistics

    import pytest

    from stagebench.pipeline._gilprobe import probe_gil

    readings = [probe_gil(fn, [0]) for _ in range(probes)]
    print(fn, [(r.get("releases"), r.get("spinner_core"), r.get("spinner_lost"), r.get("core_wait")) for r in readings])
    for r in readings:
        if "error" in r:
            pytest.skip(r["error"])
        if r["releases"] is None:
            pytest.skip("no per-thread context switch counts here (not Linux)")
        if r["spinner_core"] < 0.9:
            # a fresh clone read twelve pieces at 0.2 and one at 0.3 while the machine gave the spinner 0.63-0.96 of a core
            pytest.skip(
                f"the machine took the spinner's core (it got {r['spinner_core']:.0%} of one): short releases go unseen"
            )
    return statistics.median(r["releases"] for r in readings)


@dataclass(frozen=True, slots=True)
class AsyncSleep:
    """A coroutine stage that awaits ``ms`` milliseconds (never blocks the event loop)."""

    ms: float

    async def __call__(self, item):
        await asyncio.sleep(self.ms / 1e3)
        return item


@dataclass(frozen=True, slots=True)
class AsyncSpinSleep:
    """A coroutine stage that blocks the loop for ``spin_ms`` of Python, then awaits ``sleep_ms``."""

    spin_ms: float
    sleep_ms: float
    loops: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "loops", int(round(self.spin_ms * calibrate().loops_per_ms)))

    async def __call__(self, item):
        spin_loops(self.loops)
        await asyncio.sleep(self.sleep_ms / 1e3)
        return item
