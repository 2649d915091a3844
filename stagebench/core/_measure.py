"""Measure one point: a stage, an executor, a concurrency, a steady-state window.

The protocol (each step is there for a reason):

1. Start c workers in a closed loop over the cached inputs (cycled).
2. Warm up until every worker has delivered at least one item *and* the
   minimum warm-up has passed: process start-up, imports and cold caches stay
   outside the window.
3. Open the window; snapshot CPU and disk counters of the process tree.
4. Keep the window open for the budget, longer only when items are so slow that
   three batches of two item-latencies would not fit (never past the deadline);
   shorter when, after the minimum window, its interval is already within the
   precision asked for (sequential stopping: a steady stage needs no more).
5. Close the window, snapshot again, read PSS while workers are alive.
6. Stop taking new items, let in-flight items finish (their intervals straddle
   the window end and count fractionally), then tear the workers down.
7. Throughput = fractional item count / window, with a batch-means interval.
"""

from __future__ import annotations

import contextlib
import gc
import math
import pickle
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import cloudpickle
import numpy as np

from stagebench._memory import CAUSE, memory_short, out_of_memory, said_out_of_memory
from stagebench._numbers import finite
from stagebench.core._config import MeasureConfig
from stagebench.core._executors import (
    Runner,
    WorkerPool,
    identity,
    is_coroutine_callable,
    leaked_threads,
    make_runner,
)
from stagebench.core._mirror import Mirror, Ready, mirror
from stagebench.core._pickling import pickle_problem
from stagebench.core._resources import ResourceMonitor, TreeSnapshot, tree_pss_mb
from stagebench.core._spdl_harness import SpdlRunner
from stagebench.core._stage_draft import StageDraft, WindowRate
from stagebench.core._stats import batch_count, fractional_counts, mean_interval, percentiles_ms, t_quantile
from stagebench.model._ranks import HostRate
from stagebench.model._rate import Rate
from stagebench.runs._schema import EXECUTORS, HARNESSES

__all__ = ["measure_stage", "identity", "payload_bytes", "skipped", "window_rate", "host_figures", "POINT"]

_POLL_S = 0.01
#: What a ranked diagnosis's other ranks open for a point: the stage on their own inputs
#: (:class:`stagebench.core._point_follow.PointRun`).
POINT = "point"


#: The cyclic collector's oldest generation: a collection of it walks every object the process tracks.
_OLDEST = 2


class _GcClock:
    """Seconds the cyclic garbage collector runs in this process while installed (``gc.callbacks``), and
    of them, its full collections' (the oldest generation's).

    Why: a collection holds the GIL, and a stage that leaves many container
    objects behind triggers collections whose cost grows with everything else
    the process holds (a training script's torch, a diagnosis's pandas). Its
    calls' median time and its probed GIL share (the probe pauses the collector)
    leave them out, so the replay's stand-ins need this to charge them.
    """

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full_seconds = 0.0  # of them, the full collections' (the oldest generation: every object walked)
        self.young = 0  # collections of the younger generations: each one the allocations' threshold reached
        self._t: float | None = None

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        elif self._t is not None:
            took = time.perf_counter() - self._t
            self.seconds += took
            if info.get("generation") == _OLDEST:
                self.full_seconds += took
            else:
                self.young += 1
            self._t = None

    def __enter__(self) -> "_GcClock":
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            gc.callbacks.remove(self)
        except ValueError:
            pass


def payload_bytes(inputs: Sequence, sample: int = 8) -> float:
    """Mean pickled size of a few inputs: what a process executor ships per item."""
    sizes = []
    step = max(1, len(inputs) // sample)
    for item in list(inputs)[::step][:sample]:
        try:
            sizes.append(len(pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)))
        except Exception:
            return math.nan
    return float(np.mean(sizes)) if sizes else math.nan


def skipped(
    stage: str, role: str, executor: str, harness: str, concurrency: int, reason: str, payload: float = math.nan
) -> StageDraft:
    """A point not measured, skipped for ``reason``: its settings, started now, no time taken, every figure NaN
    (``payload``: the stage's pickled input size, where known)."""
    row = StageDraft.start(stage, role, executor, harness, concurrency)
    row.fail("skipped", reason)
    row.payload_bytes, row.elapsed_s = payload, 0.0
    return row


def _skip_reason(fn: Callable, inputs: Sequence, executor: str, pool: WorkerPool | None) -> str | None:
    """Why this stage cannot run on this executor (None if it can)."""
    coro = is_coroutine_callable(fn)
    if executor == "async" and not coro:
        return "not a coroutine function: the event loop runs only async stages"
    if executor != "async" and coro:
        return f"coroutine function: it runs on the event loop, not on a {executor} pool"
    if executor != "process":
        return None

    if pool is not None:
        pool.call_for(fn)  # a pool runs one stage (and its no-op ceiling): a mix-up is a bug, so it raises
    try:
        if pool is not None:
            pool.fn_bytes  # noqa: B018 (pickles the pool's stage once, then cached)
        else:
            cloudpickle.dumps(fn)
    except Exception as e:
        if out_of_memory(e):
            raise  # it tells nothing of whether the stage pickles: the point fails for memory
        return f"cannot be pickled for a process pool: {type(e).__name__}: {e}"

    problem = pickle_problem(inputs[0], cloud=True)
    return f"inputs cannot be pickled for a process pool: {problem}" if problem else None


def measure_stage(
    fn: Callable,
    inputs: Sequence,
    *,
    executor: str = "thread",
    concurrency: int = 1,
    config: MeasureConfig | None = None,
    name: str | None = None,
    role: str = "stage",
    harness: str = "direct",
    payload: float | None = None,
    spdl_extra_pipes: int = 0,
    pool: WorkerPool | None = None,
) -> StageDraft:
    """Measure ``fn`` over ``inputs`` at one executor and concurrency.

    ``harness="spdl"`` runs the stage inside a one-stage SPDL pipeline instead of
    stagebench's own workers (same window, same statistics);
    ``spdl_extra_pipes`` identity pipes go before it (a multi-stage pipeline).
    ``pool`` (process executor): a :class:`~stagebench.core._executors.WorkerPool`
    of this stage kept across points (``fn`` is its stage, or ``identity`` for
    the ceiling); without one, the point starts and kills its own workers.

    Returns the point, a :class:`~stagebench.core._stage_draft.StageDraft` (its fields the columns of
    :data:`stagebench.runs._schema.STAGE_COLUMNS`; ``as_row()`` is its ``results.csv`` row). Never
    raises for the stage's own faults: they become ``status``/``reason``. Only
    ``KeyboardInterrupt`` propagates, after the workers are torn down.
    """
    cfg = config or MeasureConfig()
    if executor not in EXECUTORS:
        raise ValueError(f"executor: unknown {executor!r}; allowed: {', '.join(EXECUTORS)}")
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if harness not in HARNESSES:
        raise ValueError(f"harness: unknown {harness!r}; allowed: {', '.join(HARNESSES)}")
    if spdl_extra_pipes < 0 or (spdl_extra_pipes and harness != "spdl"):
        raise ValueError(
            f"spdl_extra_pipes must be >= 0 and needs harness='spdl', got {spdl_extra_pipes} with {harness!r}"
        )
    inputs = list(inputs) if not isinstance(inputs, Sequence) else inputs
    stage = name or getattr(fn, "__name__", None) or type(fn).__name__
    row = StageDraft.start(stage, role, executor, harness, concurrency)
    row.payload_bytes = payload if payload is not None else payload_bytes(inputs)
    t_begin = time.perf_counter()

    if not inputs:
        row.fail("skipped", "no inputs")
        return row
    if executor != "process":
        pool = None
    short = memory_short()
    if short:  # it would fail for want of memory, or hang starting a thread that cannot start
        return skipped(stage, role, executor, harness, concurrency, f"not measured: {short}", row.payload_bytes)
    try:
        reason = _skip_reason(fn, inputs, executor, pool)
        if reason:
            return skipped(stage, role, executor, harness, concurrency, reason, row.payload_bytes)
        with _watchdog(cfg.timeout_s + _WATCHDOG_MARGIN_S):
            _measure(fn, inputs, executor, concurrency, cfg, harness, pool, spdl_extra_pipes, row, t_begin)
    except _PointHung:
        _ended(
            row,
            t_begin,
            "timeout",
            f"the point did not end {cfg.timeout_s + _WATCHDOG_MARGIN_S:g} s after it started: measuring it "
            "hung (a worker thread or process that could not start; a memory limit such as ulimit -v?)",
        )
    except Exception as e:
        # Out of memory here, not in the stage's call (that is the stage's own error, in its row): a stage
        # that keeps what it allocates leaves none for measuring, be it a thread's stack, a pool's semaphore
        # or the pickle of the stage. The point fails with that reason; the sweep goes on.
        what = out_of_memory(e)
        if what is None:
            raise
        _ended(
            row,
            t_begin,
            "failed",
            f"out of memory while measuring this point ({what}): the process could not allocate more; {CAUSE}",
        )
    return row


def _ended(row: StageDraft, t_begin: float, status: str, reason: str) -> None:
    """A point the measuring itself could not finish: its status, why, and the time it took."""
    row.fail(status, reason)
    row.elapsed_s = time.perf_counter() - t_begin


class _PointHung(Exception):
    """Raised in the main thread by a point's watchdog."""


#: Past a point's own deadline, its 5 s drain and its tear-down: only a hang in the measuring gets here.
_WATCHDOG_MARGIN_S = 20.0


@contextlib.contextmanager
def _watchdog(seconds: float) -> Iterator[None]:
    """Interrupt the main thread if the point outlives ``seconds`` (SIGALRM).

    Why: under a memory limit CPython can create a thread that cannot
    bootstrap, and ``Thread.start()`` then waits forever for it; no deadline
    inside the point runs again. A signal interrupts that wait. Only where a
    signal can be used: in the main thread, and when the program has no
    SIGALRM handler of its own (it is left alone).
    """
    if (
        threading.current_thread() is not threading.main_thread()
        or not hasattr(signal, "setitimer")
        or signal.getsignal(signal.SIGALRM) not in (signal.SIG_DFL, None)
    ):
        yield
        return

    def fire(signum: int, frame: Any) -> None:
        raise _PointHung()

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _measure(fn, inputs, executor, concurrency, cfg, harness, pool, spdl_extra_pipes, row: StageDraft, t_begin) -> None:
    runner: Runner
    if harness == "spdl":
        runner = SpdlRunner(fn, inputs, concurrency, executor, pool, extra_pipes=spdl_extra_pipes)
    else:
        runner = make_runner(executor, fn, inputs, concurrency, pool)
    deadline = t_begin + cfg.timeout_s
    outcome: _Outcome | None = None
    # a ranked diagnosis: every other rank runs this point on its own inputs at the same time
    ranks = _Ranked.open(row, executor, concurrency, harness, spdl_extra_pipes, cfg)
    try:
        with ResourceMonitor(cfg.sample_interval_s, runner.worker_pids) as mon:
            runner.start()
            outcome = _run_window(runner, cfg, deadline, t_begin, row, mon, ranks)
        runner.request_stop()
        # In-flight items straddle the window end; wait for them (bounded).
        idle = runner.wait_idle(max(0.0, min(deadline - time.perf_counter(), 5.0)))
        if outcome is not None:
            # Read PSS now: workers are alive but idle, so reading smaps does not
            # fight the stage for the GIL.
            row.mem_pss_mb = tree_pss_mb(runner.worker_pids())
            if not idle:
                row.reason = "an item was still running 5 s after the window closed"
    finally:
        runner.abort()
        if ranks is not None:
            ranks.close()
    if outcome is not None:
        _fill_from_records(row, runner.lanes, *outcome, cfg)
        if ranks is not None and ranks.others:
            host_figures(row, ranks.others)
    if runner.fatal is not None and row.status == "ok":
        row.fail(runner.fatal_status or "failed", runner.fatal)
    if leaked_threads():
        row.note(
            f"{leaked_threads()} worker thread(s) of a hung stage still running; later thread points may be perturbed"
        )
    row.elapsed_s = time.perf_counter() - t_begin


#: t0, t1, snap0, snap1, the collector (its seconds, its full collections' and its young collections), check_cpu_s
_Outcome = tuple[float, float, TreeSnapshot, TreeSnapshot, tuple[float, float, int], float]


def _run_window(runner, cfg, deadline, t_begin, row: StageDraft, mon, ranks: _Ranked | None = None) -> _Outcome | None:
    """Warm up, then time the window. Returns (t0, t1, snap0, snap1, gc, check_cpu_s) or None.

    ``gc``: seconds the garbage collector ran in this process during the window, of them its full
    collections', and how many young collections it ran;
    ``check_cpu_s``: CPU seconds this thread spent on sequential-stopping checks (not the stage's).
    ``ranks``: a ranked diagnosis's other ranks, each running this point: the window opens once each has
    warmed up, its CPU counts theirs, and their rates over it are read as it closes.
    """
    c = runner.concurrency
    while True:
        now = time.perf_counter()
        if runner.fatal is not None:
            row.fail(runner.fatal_status or "failed", runner.fatal)
            return None
        seen = runner.delivered_workers()
        if seen >= runner.expected_workers() and now - t_begin >= cfg.warmup_s and (ranks is None or ranks.ready()):
            if ranks is not None and ranks.failed is not None:  # a rank's point did not run: no host figure
                row.fail(*ranks.failed)
                return None
            break
        if now >= deadline:
            row.fail("timeout", f"no steady state within {cfg.timeout_s:g}s: {seen} of {c} workers delivered an item")
            row.workers_seen = seen
            return None
        time.sleep(_POLL_S)
    row.workers_seen = runner.delivered_workers()
    if cfg.precision > 0:
        # the checks' statistics import scipy on first use (0.1 s of CPU and of the GIL): not inside a window
        t_quantile(0.975, 4)
    t0 = time.perf_counter()
    row.warmup_s = t0 - t_begin
    pids = (lambda: runner.worker_pids() + ranks.pids()) if ranks is not None else runner.worker_pids
    snap0 = TreeSnapshot.take(pids(), opening=True)
    mon.peak_rss_mb = 0.0
    end = t0 + cfg.budget_s
    early = cfg.precision > 0 or cfg.below is not None
    check_at = t0 + min(cfg.min_window_s, cfg.budget_s) if early else math.inf
    extended = False
    closed_at: float | None = None
    check_cpu = 0.0
    with _GcClock() as gc_clock:
        while True:
            now = time.perf_counter()
            if runner.fatal is not None:
                row.fail(runner.fatal_status or "failed", runner.fatal)
                return None
            if now >= check_at and now < end and not extended:
                c0 = time.thread_time()
                precise = _enough(runner.lanes, t0, now, cfg)
                check_cpu += time.thread_time() - c0
                if precise:
                    closed_at = now  # the window is what was checked, not the check's own time
                    break
                check_at = now + max(0.05, cfg.min_window_s / 4)
                continue
            if now >= end:
                if extended:
                    break
                extended = True
                lat = _median_latency(runner.lanes)
                # three batches of two latencies each (5% spare so jitter cannot round
                # it down to two), capped by the deadline
                need = t0 + 6.3 * lat if math.isfinite(lat) else end
                end = min(max(end, need), deadline - 0.5)
                if end <= now:
                    break
                continue
            time.sleep(min(_POLL_S * 5, max(0.0, min(end, check_at) - now)))
        t1 = closed_at or time.perf_counter()
        snap1 = TreeSnapshot.take(pids())
    mon._sample()
    row.mem_peak_mb = mon.peak_rss_mb
    if ranks is not None:
        ranks.read(t0, t1)
        if ranks.failed is not None:
            row.fail(*ranks.failed)
            return None
    return t0, t1, snap0, snap1, (gc_clock.seconds, gc_clock.full_seconds, gc_clock.young), check_cpu


_CHECK_MAX_RECORDS = 100_000  # above this, copying the records to check would itself slow the point


def _enough(lanes, t0: float, now: float, cfg: MeasureConfig) -> bool:
    """Whether the window [t0, now] may close (sequential stopping): its interval is within
    ``cfg.precision``, or lies wholly under ``cfg.below`` (a point that cannot matter).

    The same statistic as the row's (fractional counts, batch means), over the
    items recorded so far: an item still in flight at ``now`` is not counted,
    which widens the interval, never narrows it. At least five batches of two
    latencies each, so a slow stage is never cut short on a few items.
    """
    if sum(len(lane.ends) for lane in list(lanes.values())) > _CHECK_MAX_RECORDS:
        return False
    starts, ends, _, _ = _collect(lanes, t0, now)
    done = ends <= now
    if done.sum() < 2:
        return False
    nb, _, qps, lo, hi, _ = _batch_means(starts, ends, ends[done] - starts[done], t0, now, cfg)
    if not (nb >= 5 and qps > 0 and math.isfinite(hi)):
        return False
    return bool((hi - lo) / 2 <= cfg.precision * qps or (cfg.below is not None and hi < cfg.below))


def _batch_means(starts, ends, durations, t0: float, t1: float, cfg: MeasureConfig):
    """The row's statistic over [t0, t1]: (batches, fractional items per batch, qps, low, high, cv).

    Batches of at least two median latencies (of ``durations``, the items that ended in the window),
    up to ``cfg.max_batches``; the rate of each batch is a sample of the batch-means interval.
    """
    window = t1 - t0
    lat = float(np.median(durations)) if len(durations) else window
    nb = batch_count(window, lat, cfg.max_batches)
    counts = fractional_counts(starts, ends, np.linspace(t0, t1, nb + 1))
    rate = mean_interval((counts / (window / nb)).tolist(), cfg.confidence)
    return nb, counts, rate.mean, rate.low, rate.high, rate.cv


def _median_latency(lanes) -> float:
    recent: list[float] = []
    for lane in list(lanes.values()):
        k = min(len(lane.ends), len(lane.starts), 200)
        if k:
            recent.extend(e - s for s, e in zip(lane.starts[-k:], lane.ends[-k:]))
        recent.extend(e - s for s, e, _ in lane.fails[-50:])
    return float(np.median(recent)) if recent else math.nan


def _collect(lanes, t0: float, t1: float):
    """Successful (starts, ends) overlapping the window, and failures ending in it."""
    starts: list[np.ndarray] = []
    ends: list[np.ndarray] = []
    bad: list[tuple[float, float, str]] = []
    cpus: list[np.ndarray] = []
    timed_cpu = True
    for lane in list(lanes.values()):
        n = min(len(lane.starts), len(lane.ends))
        # Slicing copies: a straggling worker may still append to its lane, and
        # an exported buffer would make its append raise.
        s = np.frombuffer(lane.starts[:n], dtype=float) if n else np.empty(0)
        e = np.frombuffer(lane.ends[:n], dtype=float) if n else np.empty(0)
        keep = (e > t0) & (s < t1)
        starts.append(s[keep])
        ends.append(e[keep])
        bad.extend(f for f in list(lane.fails) if t0 < f[1] <= t1)
        # cpu is appended before starts/ends, so it is at least n long where it is kept
        if n and len(lane.cpu) >= n:
            cpus.append(np.frombuffer(lane.cpu[:n], dtype=float)[keep])
        elif n:
            timed_cpu = False
    cat = lambda xs: np.concatenate(xs) if xs else np.empty(0)
    return cat(starts), cat(ends), bad, (cat(cpus) if timed_cpu and cpus else None)


def window_rate(lanes, t0: float, t1: float, cfg: MeasureConfig) -> WindowRate:
    """Items per second over [t0, t1] from a runner's lanes (fractional counts, batch means): ``qps``,
    ``qps_low``, ``qps_high``, ``n_items``; what a ranked diagnosis's other ranks report of the same
    window (:mod:`stagebench.core._point_follow`)."""
    starts, ends, _, _ = _collect(lanes, t0, t1)
    in_window = (ends > t0) & (ends <= t1)
    _, counts, qps, lo, hi, _ = _batch_means(starts, ends, ends[in_window] - starts[in_window], t0, t1, cfg)
    n = float(counts.sum())
    return WindowRate(qps if n > 0 else 0.0, lo, hi, n)


def _fill_from_records(
    row: StageDraft, lanes, t0, t1, snap0, snap1, gc: tuple[float, float, int], check_cpu, cfg: MeasureConfig
) -> None:
    starts, ends, bad, call_cpu = _collect(lanes, t0, t1)
    window = t1 - t0
    row.window_s = window
    row.n_errors = len(bad)
    if bad:
        row.error_example = bad[0][2] or ""
    in_window = (ends > t0) & (ends <= t1)
    durations = ends[in_window] - starts[in_window]
    nb, counts, qps, lo, hi, cv = _batch_means(starts, ends, durations, t0, t1, cfg)
    n_items = float(counts.sum())
    row.n_items, row.n_batches, row.qps = n_items, nb, qps if n_items > 0 else 0.0
    row.qps_low, row.qps_high, row.qps_cv = lo, hi, cv
    row.latency_p50_ms, row.latency_p90_ms, row.latency_p99_ms = percentiles_ms(durations)
    row.latency_mean_ms = float(durations.mean()) * 1e3 if len(durations) else math.nan
    if call_cpu is not None and in_window.any():
        # the mean, as for CPU per item: a rare long call costs what it costs
        row.call_cpu_ms = float(np.mean(call_cpu[in_window])) * 1e3
    cpu = max(0.0, snap1.cpu_since(snap0) - check_cpu)  # the stage's, not the stopping checks'
    # per CPU-counter interval, not the window: reading counters can lag the
    # window's edges when the stage's threads hold the GIL
    cpu_span = max(snap1.t - snap0.t, 1e-9)
    row.cores_used = cpu / cpu_span
    row.steal_share = snap1.steal_share_since(snap0)
    row.cores_throttled = snap1.throttled_cores_since(snap0)
    # per item completed over the counters' span: CPU, faults and collector time are read over it
    span_items = n_items * cpu_span / window
    for key, total in (
        ("cpu_s_per_item", cpu),
        ("minor_faults_per_item", snap1.minor_faults_since(snap0)),
        ("gc_s_per_item", gc[0]),
        ("gc_full_s_per_item", gc[1]),
        ("gc_young_per_item", gc[2]),
    ):
        setattr(row, key, total / span_items if n_items > 0 else math.nan)
    row.disk_read_mb_s = snap1.read_bytes_since(snap0) / window / 2**20
    row.read_mb_s = snap1.read_chars_since(snap0) / window / 2**20
    if n_items == 0:
        if bad:
            row.fail("failed", f"every item raised: {row.error_example}")
        else:
            row.fail("timeout", f"no item completed in a {window:.1f}s window")
    short = [what for _, _, err in bad if (what := said_out_of_memory(err or ""))]
    if short:
        # Calls that ran out of memory are no error of the items: the process (or a worker) had none left, and
        # a rate read then is not the stage's. Its figures stay in the row as measured; the point failed.
        row.fail("failed", f"out of memory: {len(short)} of its calls in the window ran out ({short[0]}); {CAUSE}")


class _Ranked:
    """A point of a ranked diagnosis, as the leader measures it: each other rank runs the same stage at
    the same executor, concurrency and harness on its own inputs (:mod:`stagebench.core._mirror`,
    :mod:`stagebench.core._point_follow`), and the row holds the host's figures."""

    def __init__(self, mirror: Mirror, cid: int, cfg: MeasureConfig) -> None:
        self.mirror, self.cid, self.cfg = mirror, cid, cfg
        self.asked: Ready | None = None
        self.others: list[WindowRate] = []
        self.failed: tuple[str, str] | None = None

    @classmethod
    def open(cls, row: StageDraft, executor, concurrency, harness, extra_pipes, cfg: MeasureConfig) -> _Ranked | None:
        m = mirror()
        if m is None:
            return None
        cid = m.open(
            POINT,
            stage=row.stage,
            role=row.role,
            executor=executor,
            concurrency=int(concurrency),
            harness=harness,
            extra_pipes=int(extra_pipes),
            warmup_s=cfg.warmup_s,
        )
        return cls(m, cid, cfg)

    def ready(self) -> bool:
        """Whether every other rank's point has warmed up (asked once, then polled); a rank's fault is
        :attr:`failed`."""
        if self.asked is None:
            self.asked = self.mirror.ready(self.cid)
        if not self.asked.done():
            return False
        self.failed = self.failed or self.asked.failure
        return True

    def pids(self) -> list[int]:
        """The other ranks' processes and their point's workers: the window's cores count them."""
        return list(self.mirror.processes) + (list(self.asked.pids) if self.asked is not None else [])

    def read(self, t0: float, t1: float) -> None:
        how = {"max_batches": self.cfg.max_batches, "confidence": self.cfg.confidence}
        others, failed = self.mirror.rates(self.cid, t0, t1, how)
        self.others = [WindowRate.from_json(d) for d in others]
        self.failed = self.failed or failed

    def close(self) -> None:
        self.mirror.close(self.cid)


def host_figures(row: StageDraft, others: Sequence[WindowRate]) -> None:
    """A ranked point's row: ``qps`` and its interval are the host's (the sum over its ranks: their windows
    are the same seconds of one host), the slowest and fastest rank's beside them; the CPU per item is
    the host's CPU (the window's counters read every rank's processes) over the host's items. A rank that
    timed nothing leaves the point failed: no host figure stands without it."""

    def rate(q: Any, lo: Any, hi: Any) -> Rate | None:
        if not isinstance(q, (int, float)) or not q > 0:
            return None
        if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and math.isfinite(lo) and math.isfinite(hi):
            return Rate(float(q), max(0.0, min(float(lo), float(q))), max(float(hi), float(q)))
        return Rate(float(q))

    theirs = (rate(d.qps, d.qps_low, d.qps_high) for d in others)
    rates = HostRate.of([rate(row.qps, row.qps_low, row.qps_high), *theirs])
    row.ranks = len(rates.ranks)
    host, slow, fast = rates.host, rates.slowest, rates.fastest
    if host is None or slow is None or fast is None:
        if row.status == "ok":
            missing = [str(r) for r, x in enumerate(rates.ranks) if x is None]
            row.fail("failed", f"local rank(s) {', '.join(missing)} completed no item in the window")
        return
    mine = float(row.qps)
    row.qps = host.value
    row.qps_low = host.low if host.low is not None else math.nan
    row.qps_high = host.high if host.high is not None else math.nan
    row.rank_min_qps, row.rank_max_qps = slow.value, fast.value
    if host.value > 0:  # every rank's counters over every rank's items
        if finite(row.cpu_s_per_item):
            row.cpu_s_per_item = row.cpu_s_per_item * mine / host.value
        if finite(row.minor_faults_per_item):
            row.minor_faults_per_item = row.minor_faults_per_item * mine / host.value
