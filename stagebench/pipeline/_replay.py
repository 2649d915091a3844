"""Replay: the whole pipeline run with stand-ins that do what each stage did alone.

The prediction's bounds (:mod:`stagebench.analysis._predict`) add per-item demands measured stage by
stage, but together the stages also pay for each other: hand-offs to and from the event loop, threads
waking and queueing for the GIL, a GIL holder losing its core. So the prediction runs the pipeline
itself, with SPDL, the recommended settings and the real aggregate / disaggregate steps, each measured
stage replaced by a **stand-in** built from its isolated measurements only:

- ``gil_s``: pure Python (holds the GIL): the stage's GIL share of its time per call, capped by its own
  CPU per call, plus the cyclic garbage collection its allocations cost per item (``gc_s_per_item``),
  which neither the calls' median time nor the probed GIL share includes, where the stand-in does
  not make that collection happen itself (``containers``);
- ``containers``: a stage that left at least one young collection a call behind it alone
  (``gc_young_per_item``, beyond its no-op ceiling's: each is the collector's threshold of containers,
  700 by default) makes its stand-in allocate as many, held through the call, as the stage's own lists
  of lists are: the collector then runs in the replay as it does in the pipeline, young collections and
  the full ones that what they find alive sets off, each walking what the process holds *then*. Its
  ``gc_s_per_item`` is not added: read in one short window alone, it is a few full collections (tens
  of ms each), a count that moves 2x from window to window, where the demo's augment spends most of
  its collector time (docs/accuracy.md). A stage under one young collection a call keeps what it left
  behind alive past its calls, which a stand-in cannot: it carries ``gc_s_per_item`` as GIL-held work;
- ``free_s``: the rest of that CPU, without the GIL (``hashlib`` over a buffer);
- ``wait_s``: a sleep for what remains of its time per call, less what a sleep itself costs here
  (calibrated right before the replay: it is already in the stage's measured CPU and duration), and
  never more than the call spent off the CPU;
- ``releases``: how many times per call its GIL-free work lets the GIL go (the GIL probe's count,
  :mod:`stagebench.pipeline._gilprobe`, a lower bound); each release costs a wait to take it back,
  so the work is done in that many pieces;
- ``helper_s``: CPU on the stage's own threads while the calling thread waits, hashed on ``helpers``
  threads at once, so that a stage computing on its own threads does not read as one that waits.

A stage on a process executor becomes a thread stand-in whose work is all GIL-free, plus the main
process's cost of moving items to and from workers. Stages that yield several items, or were not
measured, run as themselves. A stand-in returns real outputs of its stage (a few kept from the
diagnosis), so the steps after it get items of the right kind. Nothing of the user's code runs, so the
replay is a prediction, which the validation run checks.

A stand-in does a fixed amount of *work*, not a fixed CPU time: a shared host's cores change speed in
phases of seconds, and a fixed CPU time would do less work in a slow phase than the stage did. So its
GIL-held part is iterations of the speed probe's loop, in runs of the probe's length so that each costs
what the probe read (:func:`stagebench.core._speed.speed_work`), at the sweep's speed; without a speed
probed, it spins for the CPU time. Its GIL-free part is bytes of SHA-256 at the hash's speed now, not
scaled by the loop's: native code does not keep the interpreter's clock. Here, in phases where the loop
ran 1.77x slower, SHA-256 ran 1.04x slower, inflating 1.19x and a JPEG decode 1.28x, so bytes scaled by
the loop's speed would follow a clock the stage does not: one calibration in a slow phase of the loop
would put 1.8x a decode's work into its stand-in (docs/accuracy.md). Only a process stage's own Python
(``python_free_s``: GIL-free here, as it runs outside this process's GIL) follows the loop's speed, as
the GIL-held part does.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import itertools
import os
import statistics
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from stagebench._numbers import num_or_none
from stagebench.core._speed import cpu_speed_ns, speed_work
from stagebench.model._stage import StageEntry, StageSetting

__all__ = ["StandIn", "plan_stand_ins"]

_BUF = os.urandom(1 << 20)  # hashed, never read otherwise: what it holds does not matter
_BIG: bytes | None = None  # _BUF 16 times (16 MiB, ~8 ms of hashing here), made when a piece needs more than _BUF
_HASH_MIN_BYTES = 2048  # CPython's hashlib keeps the GIL for smaller buffers (HASHLIB_GIL_MINSIZE)
_MAX_PIECES = (
    64  # releases per call a stand-in makes at most (the probe reads 15-17 for the demo's 16-image numpy collate)
)
_CALIBRATION: tuple[float, float] | None = None


def _calibration() -> tuple[float, float]:
    """(CPU seconds per byte of SHA-256, the speed probe's ns per loop) here, now, taken together.

    SHA-256: the mean of 16 runs over 256 KiB (~0.15 ms each here), interleaved
    with the speed probe, after one that is not timed. The mean, not the median
    of a few: a shared host's core speed flips in phases, and a calibration taken
    in one would make every GIL-free stand-in that much too long or too short.
    The hash before is left out: the first over a buffer out of the caches, after
    the pause before a replay, ran 0.3-1.4 ms against 0.15 for the rest, and put
    the mean 15-26% above the hash the stand-ins then run on a buffer they keep
    hot (in three demo runs); every GIL-free stand-in did that much less work than
    its stage. The loop's speed read alongside converts the Python a process stage
    runs (at the loop's speed then against now).
    """
    global _CALIBRATION
    if _CALIBRATION is None:
        view = memoryview(_BUF)[: 1 << 18]
        hashlib.sha256(view).digest()  # not timed: brings the buffer into the caches (docstring)
        ts, speeds = [], []
        for _ in range(16):
            c0 = time.thread_time()
            hashlib.sha256(view).digest()
            ts.append(time.thread_time() - c0)
            speeds.append(cpu_speed_ns(trials=1))
        _CALIBRATION = (max(statistics.fmean(ts), 1e-7) / len(view), statistics.fmean(speeds))
    return _CALIBRATION


_SLEEP_COST: dict[float, tuple[float, float]] = {}


def _sleep_cost(seconds: float) -> tuple[float, float]:
    """(CPU, oversleep) of one ``time.sleep(seconds)`` here, now: medians of a few calls.

    A sleep is not free: it costs CPU and wakes late. The stage's own waiting paid both, inside the CPU and the
    duration measured for it; the stand-in's sleep pays them again, so they
    are taken out of what it is asked to do. About 0.15 s per distinct wait.
    """
    key = round(seconds, 4)
    if key not in _SLEEP_COST:
        n = max(3, min(15, int(0.15 / max(seconds, 1e-4))))
        cpu, over = [], []
        for _ in range(n):
            c0, t0 = time.thread_time(), time.perf_counter()
            time.sleep(seconds)
            over.append(time.perf_counter() - t0 - seconds)
            cpu.append(time.thread_time() - c0)
        _SLEEP_COST[key] = (max(0.0, statistics.median(cpu)), max(0.0, statistics.median(over)))
    return _SLEEP_COST[key]


_CONTAINER_S: float | None = None
_MAX_CONTAINERS = 1_000_000  # a stand-in holds at most this many lists (about 70 MB) through a call


def _container_cost() -> float:
    """CPU seconds to make one container of the stand-ins' (a one-item list, in a list), here, now: the
    median of a few runs of 4,096, with the collector off (its collections are not the allocation's)."""
    global _CONTAINER_S
    if _CONTAINER_S is None:
        was = gc.isenabled()
        gc.disable()
        try:
            ts = []
            for _ in range(7):
                c0 = time.thread_time()
                held = _make_containers(4096)
                ts.append(time.thread_time() - c0)
                del held
        finally:
            if was:
                gc.enable()
        _CONTAINER_S = statistics.median(ts) / 4096
    return _CONTAINER_S


def _make_containers(n: int) -> list:
    """``n`` containers the collector tracks, alive while the list is (as a stage's list of lists)."""
    return [[None] for _ in range(n)]


def containers_for(young_per_call: float | None) -> int:
    """Containers a stand-in allocates and holds through a call so that the collector runs as often as its
    stage made it (``young_per_call`` young collections a call, beyond its no-op ceiling's), or 0 where it
    made fewer than one a call (or the collector is off).

    A call that makes n containers and lets them go at its end sets off floor(n / threshold) collections:
    the count restarts at each one and cannot go below zero as they are freed, so the next call starts
    from about zero. So k collections a call take between k and k + 1 thresholds of containers; the
    middle is taken. Under one a call, the stage kept what it made alive past its calls (in its outputs,
    a cache), which a stand-in that returns the stage's kept outputs cannot do."""
    threshold = gc.get_threshold()[0]
    if young_per_call is None or not young_per_call >= 1 or threshold <= 0 or not gc.isenabled():
        return 0
    return min(_MAX_CONTAINERS, int(round((young_per_call + 0.5) * threshold)))


def _spin(seconds: float) -> None:
    """Hold the GIL for ``seconds`` of this thread's CPU time (waiting for a core does not count)."""
    t0 = time.thread_time()
    while time.thread_time() - t0 < seconds:
        pass


class _Work:
    """One stand-in's CPU as fixed work: loop iterations (GIL held) and SHA-256 bytes (GIL free).

    ``speed_ns``: the speed probe's ns per loop iteration while the stage was
    measured; None: fixed CPU time instead (no speed was probed). ``python_free_s``:
    of ``free_s``, Python run outside this process's GIL (a process stage's own),
    whose work follows the loop's speed (module docstring).
    """

    def __init__(
        self,
        gil_s: float,
        free_s: float,
        speed_ns: float | None,
        releases: int = 1,
        python_free_s: float = 0.0,
        containers: int = 0,
    ) -> None:
        self.containers = containers
        if containers:  # making them is the stage's Python too: out of its GIL-held work, at what it costs now
            made_s = containers * _container_cost()
            if speed_ns:
                _, now_ns = _calibration()
                gil_s = max(0.0, gil_s - made_s * speed_ns / now_ns)  # the work, at the loop's speed then
            else:
                gil_s = max(0.0, gil_s - made_s)
        self.gil_s = gil_s
        self.loops = int(round(gil_s * 1e9 / speed_ns)) if speed_ns and gil_s > 0 else 0
        self.free_bytes = 0
        if free_s > 0:
            s_per_byte, now_ns = _calibration()
            python = min(max(0.0, python_free_s), free_s)
            # native work: bytes at the hash's speed now (it does not keep the loop's clock: module docstring)
            nbytes = (free_s - python) / s_per_byte
            if python > 0:  # Python run outside this GIL: what it costs now, from the loop's speed then and now
                nbytes += python * (now_ns / speed_ns if speed_ns and now_ns > 0 else 1.0) / s_per_byte
            self.free_bytes = int(nbytes)
        # each piece: its share of the loops, then its share of the bytes (a GIL release);
        # SHA-256 keeps the GIL for buffers under _HASH_MIN_BYTES, so no piece is smaller
        self.pieces = n = max(1, min(int(releases), _MAX_PIECES, self.free_bytes // _HASH_MIN_BYTES))
        # one piece's share, worked out once (a call is the replay's hot path); the remainders,
        # under n loops and n bytes, are left out
        self._piece = (self.loops // n, gil_s / n, self.free_bytes // n)

    def __call__(self) -> None:
        loops, gil_s, nbytes = self._piece
        held = _make_containers(self.containers) if self.containers else None  # made first, as a list of lists
        for _ in range(self.pieces):
            if loops:
                speed_work(loops)
            elif gil_s > 0:
                _spin(gil_s)
            if nbytes:
                _burn_free(nbytes)
        del held  # let go at the call's end, as the stage's own


def _burn_free(n_bytes: int) -> None:
    """CPU without the GIL in as few hashes as the buffers allow: one GIL release per 16 MiB.

    SHA-256 releases the GIL for buffers of 2 KiB and more. Each hash is a
    release, and the stand-in's releases are meant to be its stage's
    (``releases``): hashed in 1 MiB slices, 3 ms of GIL-free work let the GIL go
    six times and the probe read it as 6.2 releases, against 1.4 for one hash.
    """
    global _BIG
    buf = _BUF
    if n_bytes > len(_BUF):
        if _BIG is None:
            _BIG = _BUF * 16
        buf = _BIG
    view = memoryview(buf)
    while n_bytes > 0:
        k = min(n_bytes, len(view))
        hashlib.sha256(view[:k]).digest()
        n_bytes -= k


@dataclass(frozen=True, slots=True)
class StandIn:
    """What one stage's stand-in does per call, in seconds, and where it runs."""

    name: str
    executor: str  # the recommended executor it stands in for
    concurrency: int
    gil_s: float
    free_s: float
    wait_s: float
    note: str = ""
    speed_ns: float | None = None  # the core's speed while the stage was measured (see the module docstring)
    releases: int = 1  # GIL releases per call in its GIL-free work (see the module docstring)
    python_free_s: float = 0.0  # of free_s, a process stage's own Python (see the module docstring)
    helper_s: float = 0.0  # CPU per call on threads of the stage's own (see the module docstring)
    helpers: int = 1  # how many of those threads work at once
    containers: int = 0  # allocated and held through each call: the collector runs for real (module docstring)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def op(self, outputs: Sequence[Any] | None = None) -> Any:
        """The callable the replay pipeline runs (async for the event loop's own stages).

        It returns ``outputs`` in turn (real outputs of the stage, so that what
        follows it gets items of the right kind), or its input when there are none.
        """
        return _AsyncStandIn(self, outputs) if self.executor == "async" else _ThreadStandIn(self, outputs)


class _Outputs:
    """The stand-in's return value: the stage's own outputs in turn, else the input passed on."""

    def __init__(self, outputs: Sequence[Any] | None) -> None:
        self._cycle = itertools.cycle(list(outputs)) if outputs else None

    def __call__(self, item: Any) -> Any:
        return item if self._cycle is None else next(self._cycle)


class _Helpers:
    """The CPU a stage spends on threads of its own, as GIL-free work on a pool: ``width`` pieces at once
    per call, the calling thread waiting for them as it waited for the stage's."""

    def __init__(self, s: StandIn) -> None:
        self.width = max(1, s.helpers)
        self.piece = _Work(0.0, s.helper_s / self.width, s.speed_ns) if s.helper_s > 0 else None
        # wall time the helpers take of the call's wait: their CPU over their width
        self.wall_s = s.helper_s / self.width if self.piece is not None else 0.0
        self._pool: ThreadPoolExecutor | None = None
        self._size = max(1, s.concurrency) * self.width

    def __call__(self) -> None:
        if self.piece is None:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._size, thread_name_prefix="stagebench-replay-helper")
        for f in [self._pool.submit(self.piece) for _ in range(self.width)]:
            f.result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


class _ThreadStandIn:
    def __init__(self, s: StandIn, outputs: Sequence[Any] | None = None) -> None:
        self.work = _Work(s.gil_s, s.free_s, s.speed_ns, s.releases, s.python_free_s, s.containers)
        self.helpers = _Helpers(s)
        self.wait_s = max(0.0, s.wait_s - self.helpers.wall_s)  # the rest of its wait, after its helpers
        self.output = _Outputs(outputs)

    def __call__(self, item: Any) -> Any:
        self.work()
        self.helpers()
        if self.wait_s > 0:
            time.sleep(self.wait_s)
        return self.output(item)

    def close(self) -> None:
        """Stop the helpers' threads (the replay's pipeline has ended)."""
        self.helpers.close()


class _AsyncStandIn:
    """Runs on the event loop: all its CPU holds the GIL, its waits are awaits."""

    def __init__(self, s: StandIn, outputs: Sequence[Any] | None = None) -> None:
        self.work, self.wait_s = _Work(s.gil_s + s.free_s, 0.0, s.speed_ns, containers=s.containers), s.wait_s
        self.output = _Outputs(outputs)

    async def __call__(self, item: Any) -> Any:
        self.work()
        await asyncio.sleep(self.wait_s)
        return self.output(item)


_MIN_SPREAD = 2.0  # the curve's throughput must span this ratio for a slope to mean anything
_MIN_R2 = 0.9


def _marginal_cpu(points: Sequence[StageSetting]) -> float | None:
    """CPU per extra item along a stage's curve: the slope of CPU per second against items per second.

    Why not CPU per item at one point: a harness that is not busy spends CPU
    per second (its event loop waking, timers, polling) that a slow point
    divides over few items, and a stand-in charged it holds the GIL too long.
    Inside a pipeline that the GIL binds, the main process never idles, so the
    marginal cost is what counts. ``None``
    (use the point) when the throughputs span less than 2x (a stage that
    flattened at once: the GIL-bound ones) or the line does not fit.
    """
    read = [(num_or_none(p.qps), num_or_none(p.cpu_s_per_item)) for p in points]
    pts = [(q, c) for q, c in read if q is not None and c is not None and q > 0 and c > 0]
    if len(pts) < 3:
        return None
    x = np.array([q for q, _ in pts])
    y = np.array([q * c for q, c in pts])  # CPU seconds per second
    if x.max() / x.min() < _MIN_SPREAD:
        return None
    slope, icpt = np.polyfit(x, y, 1)
    resid = y - (slope * x + icpt)
    ss = float(((y - y.mean()) ** 2).sum())
    if not slope > 0 or ss <= 0 or 1.0 - float((resid**2).sum()) / ss < _MIN_R2:
        return None
    return float(slope)


def _call_time(t: float, curve: Sequence[StageSetting]) -> tuple[float, float | None]:
    """The stage's time per call, and its CPU where that time was read (None where not read).

    The call itself at the lowest level (least contention), timed where it runs: the closed
    loop's time per item also holds, at low concurrency, the harness's hand-offs, which the
    stand-in would otherwise wait out.
    """
    p50 = num_or_none(curve[0].latency_p50_ms) if curve else None
    if p50 is None or p50 <= 0:
        return t, None
    return min(t, p50 / 1e3), num_or_none(curve[0].call_cpu_s)


def _own_cpu(
    st: StageEntry, base: StageSetting, curve: Sequence[StageSetting], t: float, gc_s: float, cores: float | None
) -> tuple[float | None, float]:
    """The stage's own CPU per call (None where nothing measured it), and the CPU of threads of its own
    beyond it (0 where none). ``cores``: the cores the run could use (None: not recorded)."""
    cpu, harness = num_or_none(base.cpu_s_per_item), num_or_none(base.harness_gil_s_per_item) or 0.0
    call_cpu = num_or_none(base.call_cpu_s)
    if call_cpu is None:
        marginal = _marginal_cpu(curve)
        if marginal is not None:
            cpu = marginal
        return (min(t + gc_s, max(0.0, cpu - harness)) if cpu is not None else None), 0.0
    # measured directly: the calling thread's CPU during the call, no harness in it
    own = min(t + gc_s, max(0.0, call_cpu))
    if cpu is not None and not st.is_async:
        # the process's CPU beyond the calling thread's and the harness's: threads of the stage's own,
        # where it is at least half the call's time (below that, the harness's idle cost) and half the
        # harness's own cost per item, which is read at another point and moves with the host's speed
        # (SPDL's pipeline_definitions: a 0.8 us call beside 0.14 ms of harness read 0.002-0.018 ms
        # "beyond" from run to run, and 4-12 spinning helper threads slowed its replay 25-30%)
        # A call that holds the GIL for most of its time runs Python on its calling thread: the process's CPU
        # beyond it is then the GIL's hand-offs with the harness's threads, which the no-op, holding it for no
        # time, never pays (bench cpu_free's 0.2 ms spin, GIL 0.96: 0.17 ms "beyond", and its stand-in's
        # helper thread took it to 1.46 ms a call in the replay against the real 0.21; the prediction -22%).
        # Threads of its own work while its call runs, at most on every core the run has: CPU beyond that is
        # not theirs but the harness's, read at another moment of the host's speed (bench mixed6's tag, a
        # 4 us call, read 0.20 ms beyond in a sweep whose speed moved 2x: 55 helper threads, its stand-in
        # 3.2 ms a call in the replay and the prediction -33%).
        beyond = cpu - harness - max(0.0, call_cpu)
        frac = num_or_none(st.gil_fraction)
        room = cores * t if cores is not None else float("inf")
        if 0.5 * max(t, harness) <= beyond <= room and (frac is None or frac < 0.5):
            return own, beyond
    return own, 0.0


def _gil_share(st: StageEntry) -> tuple[float | None, str]:
    """The GIL share the stand-in holds, and a note where it is only bounded.

    Only bounded from above (not probed: STAGEBENCH_GIL_PROBE=off, or the probe failed): its
    threads ran into the cores before any GIL cap showed, so much of its CPU ran without the GIL.
    The estimate's midpoint is a guess that reads high on stages that release the GIL in native
    code; the lower end is what the data allow. Where the probe runs, its reading replaces this.
    """
    frac = num_or_none(st.gil_fraction)
    bounded = st.gil_only_bounded
    if frac is not None and bounded is not None:
        return bounded[0], "GIL share only bounded from above: the stand-in takes its lower end"
    return frac, ""


def _less_sleep_cost(own: float, wait: float) -> tuple[float, float]:
    """(own CPU, wait) with the stand-in's sleep's own cost taken out once.

    The stand-in's time.sleep costs CPU and wakes late, as the stage's own waiting did (both are
    inside its measured CPU and duration). A stage whose idle time is shorter than a sleep's
    lateness was not sleeping (GIL hand-offs): its stand-in does not sleep either.
    """
    s_cpu, s_over = _sleep_cost(wait)
    cpu_back = min(own, s_cpu)
    slept = wait + cpu_back - s_over
    if slept > 0:
        return own - cpu_back, slept
    return own, 0.0


def _given(s: StageSetting | None) -> StageSetting | None:
    """``s`` where the entry held a setting there (an empty dict reads as a setting of no keys: none)."""
    return s if s is not None and s.keys else None


def _stand_in(st: StageEntry, speed_ns: float | None, cores: float | None = None) -> StandIn | None:
    rec = _given(st.recommended)
    t = num_or_none(st.stage_s_per_item)
    if not st.ok or rec is None or not rec.executor or t is None or t <= 0:
        return None
    alts = st.alternatives
    ex, c = str(rec.executor), int(rec.concurrency or 0)
    # The stage's own CPU and time per call come from the executor its GIL share was
    # read on (threads or the event loop), at that executor's best point.
    base_ex = "async" if st.is_async else "thread"
    base = _given(alts.get(base_ex)) or (_given(alts.get(ex)) if ex != "process" else None) or StageSetting()
    curve = st.curves.get(f"{st.harness}/{base_ex}") or ()
    t, low_cpu = _call_time(t, curve)
    if st.fused_chain:
        # its time is the fused call's less the chain's, two readings at different moments and floored at 1% of
        # the call; its CPU is read on its own thread inside the call, and a call lasts at least its CPU (SPDL's
        # convert: 0.013 ms of time left beside 0.07-0.13 ms of CPU, 0.10 ms of CPU a call in the pipeline)
        t = max(t, num_or_none(base.call_cpu_s) or 0.0)
    # The collections its allocations trigger: inside its calls' mean CPU, outside their
    # median time and outside the probed GIL share (the probe pauses the collector).
    gc_s = max(0.0, num_or_none(base.gc_s_per_item) or 0.0)
    own, helper_s = _own_cpu(st, base, curve, t, gc_s, cores)
    frac, note = _gil_share(st)
    if own is None:
        # no CPU reading: the GIL share of the time is all there is
        own = t * frac if frac is not None else 0.0
        note = "; ".join(
            x for x in (note, "no CPU per call measured: the GIL share of its time stands for its CPU") if x
        )
    gc_part = min(own, gc_s)  # the collector holds the GIL: GIL-held work, whatever the stage's share
    own -= gc_part
    wait = max(0.0, t - own)
    if low_cpu is not None and not st.is_async:
        # At most what the call spent off the CPU where t was read: t less a CPU reading from
        # another point also holds the host's change of speed between the two, and the stand-in
        # would sleep a wait the stage never had. (The collector's time is in a call's mean CPU,
        # not in its median time: out of both, as above.)
        wait = min(wait, max(0.0, t - max(0.0, low_cpu - gc_s)))
    if st.fused_chain and wait > 0:
        # its time is the fused call's less the chain's as each ran alone: a difference of two readings
        # at different moments, which a busy host leaves tens of times the stage's own (SPDL's convert:
        # 28 ms left of a 74 ms fused call, 0.85 ms a call in the pipeline). Its CPU is read inside the call.
        wait = 0.0
        note = "; ".join(
            x for x in (note, f"measured fused with {', '.join(st.fused_chain)}: its own CPU only, no wait") if x
        )
    if wait > 0 and not st.is_async:
        own, wait = _less_sleep_cost(own, wait)
    gil = min(own, frac * t) if frac is not None else own
    free = own - gil
    # on threads or the event loop, a stage that set off a young collection a call or more: its stand-in
    # allocates as it did and the collector runs for real; else its collections are GIL-held work
    young = num_or_none(base.gc_young_per_item)
    containers = 0 if ex == "process" else containers_for(young)
    if containers:
        note = "; ".join(
            x
            for x in (note, f"{young:.2g} young collections a call: holds {containers:,} containers through each")
            if x
        )
    else:
        gil += gc_part
    helpers = 1
    if helper_s > 0:
        # as many at once as its CPU over the time the call spent off its own CPU (its wait)
        helpers = max(1, round(helper_s / wait)) if wait > 0 else max(1, round(helper_s / t))
        note = "; ".join(x for x in (note, f"{helper_s * 1e3:.3g} ms a call on {helpers} thread(s) of its own") if x)
    if ex == "process":
        proc = _given(alts.get("process")) or StageSetting()
        ipc = num_or_none(proc.ipc_s_per_item)
        if ipc is None:  # no pair of ceilings at one concurrency: the two at the stage's two best points
            harness = num_or_none(base.harness_gil_s_per_item) or 0.0
            ipc = max(0.0, (num_or_none(proc.harness_gil_s_per_item) or 0.0) - harness)
        return StandIn(
            st.name,
            ex,
            c,
            gil_s=ipc,
            free_s=gil + free,
            python_free_s=gil,
            wait_s=wait,
            speed_ns=speed_ns,
            note="process: its work runs outside the main process's GIL; the main process "
            "pays the moving of items (process no-op ceiling beyond the thread one)",
            helper_s=helper_s,
            helpers=helpers,
        )
    # The probe counts every release, its waits' too; the stand-in's sleep is one of them.
    probed = num_or_none(st.gil.releases_per_call) if st.gil is not None else None
    releases = max(1, round(probed) - (1 if wait > 0 else 0)) if probed is not None else 1
    if probed is not None and probed <= 0 and free > 0:
        # The probe saw not one release in all the calls it watched: the share of the stage's CPU read as
        # GIL-free (a pure-Python stage reads 95%, not 100%) holds the GIL too. Done GIL-free, the stand-in
        # would take the GIL back once a call, a wait where threads queue for it (a 0.6 ms pure-Python
        # stage beside 16 waking threads: its stand-in 7% slower than the stage, 5% held). A count above
        # zero is a lower bound (gil_mix's mixed stage reads 0.2 a call for a quarter of its CPU GIL-free).
        gil, free = gil + free, 0.0
        note = "; ".join(x for x in (note, "no GIL release probed: all its CPU holds the GIL") if x)
    return StandIn(
        st.name,
        ex,
        c,
        gil_s=gil,
        free_s=free,
        wait_s=wait,
        note=note,
        speed_ns=speed_ns,
        releases=releases,
        helper_s=helper_s,
        helpers=helpers,
        containers=containers,
    )


def plan_stand_ins(
    stages: list[StageEntry], speed_ns: dict[str, float] | None = None, cores: float | None = None
) -> dict[str, StandIn]:
    """Stand-ins for the measured stages of a summary (its entries), by name.

    ``speed_ns``: per stage, the core's speed while it was measured (the
    median of the speed probes after its points); a stage without one does
    fixed CPU time instead of fixed work. ``cores``: the cores the run could
    use, which bound what a stage's own threads can do during its call (None:
    not recorded, no bound). Stages left out (not measured, no
    per-call time, or yielding several items per input) run as themselves in
    the replay.
    """
    pipes = [st for st in stages if (st.type if "type" in st.keys else "pipe") == "pipe"]
    made = (_stand_in(st, speed_ns.get(st.name) if speed_ns else None, cores) for st in pipes)
    return {s.name: s for s in made if s is not None}
