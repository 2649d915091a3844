"""One loader setting measured: the protocol behind every loader point.

A data loader is measured the way a training loop uses it: a fresh loader per setting, iterated by a
consumer that takes batches as fast as they come. The protocol:

1. Build the loader and iterate it in a consumer thread (:mod:`stagebench.loader._consumer`: a hung
   worker can be timed out and torn down).
2. Warm up until every worker process has delivered a batch (batches are tagged with the process that
   made them: :mod:`stagebench.loader._built`).
3. Time a window over the batches' arrivals (:mod:`stagebench.loader._window`).
4. After the window: CPU counters of main process + workers (explicit pids, never a scan of /proc
   during the window), then PSS/USS of the same processes while the workers are alive.
5. The epoch boundary: the measured epoch is ended on purpose, then short epochs follow; the stall is
   the time from the last batch of one epoch to the first batch of the next, with this point's
   ``persistent_workers`` setting.
6. Tear down the loader and its workers.
"""

from __future__ import annotations

import math
import os
import signal
import statistics
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any, NamedTuple

from stagebench.core._resources import TreeSnapshot, tree_memory_mb
from stagebench.loader._built import _cuda_available
from stagebench.loader._config import LoaderFactory, LoaderSweepConfig
from stagebench.loader._consumer import _classify, _Consumer, _SpdlErrors, _teardown
from stagebench.loader._draft import PointDraft
from stagebench.loader._window import (
    _Event,
    _host_figures,
    _rough_batch_rate,
    share_slices,
    startup_split,
    window_rate,
    window_share,
)
from stagebench.model._knobs import LoaderKnobs
from stagebench.model._loader import STALL_NOT_MEASURED
from stagebench.model._ranks import WindowShare
from stagebench.runs._knobs import normalize_knobs

__all__ = ["measure_loader_point", "timed_window", "Window", "workers_beyond_cores_unwarned"]

_POLL_S = 0.005


def measure_loader_point(
    factory: LoaderFactory,
    knobs: LoaderKnobs,
    *,
    name: str = "loader",
    backend: str = "torch",
    batch_size: int | None = None,
    config: LoaderSweepConfig | None = None,
    phase: str = "",
    cuda: bool | None = None,
    stall: bool | None = None,
    throughput: bool = True,
    cannot_matter_below: float | None = None,
    during: Callable[[Any], None] | None = None,
) -> PointDraft:
    """Measure one loader setting on a fresh loader; returns the point measured (its row: :meth:`PointDraft.as_row`).

    ``stall``: measure the epoch-boundary stall after the window (``None``: as
    ``config.epoch_stall`` says; a search passes where ``stall_at`` wants it). ``throughput=False``: no window, only the
    stall (the search's last step, at its pick). ``cannot_matter_below``: samples/s; a window
    whose interval lies wholly under it closes at the minimum (it cannot be the answer). ``during``:
    with ``throughput=False``, called with the warm consumer before the stall (:class:`_Plan`).
    Never raises for the loader's own faults (a raising or dying worker, a hang):
    they become ``status``/``reason``. ``KeyboardInterrupt`` propagates after
    the loader and its workers are torn down.
    """
    cfg = config or LoaderSweepConfig()
    cuda = _cuda_available() if cuda is None else cuda
    stall = cfg.epoch_stall if stall is None else stall
    eff, shown, notes = normalize_knobs(knobs, backend, cuda=cuda)
    row = PointDraft.start(name, backend, eff, shown, phase, notes)
    t_begin = time.perf_counter()
    deadline = t_begin + cfg.timeout_s
    errors = _SpdlErrors()
    cons = _Consumer(factory, eff, cfg.warmup_s)
    errors.attach()
    outcome = None
    hung = False
    plan = _Plan(stall=stall, throughput=throughput, batch_size=batch_size, floor=cannot_matter_below, during=during)
    with _quiet_sigchld():
        try:
            cons.start()
            outcome, hung = _supervise(cons, eff, cfg, deadline, row, errors, plan)
        except KeyboardInterrupt:
            _teardown(cons, hung=True)
            errors.detach()
            raise
        t_down = time.perf_counter()
        try:
            for note in _teardown(cons, hung=hung):
                row.note(note)
        finally:
            errors.detach()
        row.teardown_s = time.perf_counter() - t_down
    if row.status == "ok":  # a fault during the epoch-stall phase (the consumer's, or SPDL's)
        _failed(cons, errors, row)
    _fill(row, cons, outcome, eff, batch_size, cfg)
    row.elapsed_s = time.perf_counter() - t_begin
    return row


@contextmanager
def workers_beyond_cores_unwarned() -> Iterator[None]:
    """Silence torch's warning that num_workers exceeds the cores ("might get DataLoader running slow or
    even freeze"), which it gives when a DataLoader is built and again each time it is iterated: the
    sweep and the job runs go there on purpose, measure what it costs, and say so in their findings."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r"This DataLoader will create \d+ worker processes", category=UserWarning
        )
        yield


@contextmanager
def _quiet_sigchld() -> Iterator[None]:
    """Keep torch's SIGCHLD handler from raising in the main thread during a point.

    Once any DataLoader iterator was created on the main thread, torch keeps a
    process-wide SIGCHLD handler that raises ``RuntimeError: DataLoader worker
    ... is killed`` wherever the main thread happens to be (here: in the
    supervisor's sleep, or its teardown). The sweep detects dead workers itself
    and records the point as crashed, so the handler is set aside meanwhile.
    """
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGCHLD"):
        yield
        return
    previous = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGCHLD, previous)


def _failure(cons: _Consumer, errors: _SpdlErrors, check_workers: bool = False) -> tuple[str, str] | None:
    if cons.error is not None:
        return cons.error
    if errors.records:
        return _classify(errors.records[0])
    if check_workers:
        dead = cons.dead_worker()
        if dead:
            return _classify(dead, crash=True)
    return None


def _failed(cons: _Consumer, errors: _SpdlErrors, row: PointDraft, *, check_workers: bool = False) -> bool:
    """Whether the loader has failed (:func:`_failure`); where it has, ``row``'s status and reason say how."""
    fail = _failure(cons, errors, check_workers=check_workers)
    if fail:
        row.fail(*fail)
    return fail is not None


class Window(NamedTuple):
    """A steady-state window: when it opened and closed, the process tree's CPU and I/O at each end
    (:class:`stagebench.core._resources.TreeSnapshot`: every rank's processes in a ranked sweep), and the
    memory read as it closed (MB: ``main``, ``pss``, ``uss``, ``workers``: this rank's)."""

    t0: float
    t1: float
    opened: Any
    closed: Any
    memory_mb: dict[str, float]
    #: a ranked sweep: each other rank's share of the same window (:func:`window_share`), by local rank; ()
    #: on one rank
    others: tuple[WindowShare | None, ...] = ()
    #: a ranked sweep: the slices every rank's share is cut into
    slices: int = 0


class _Plan(NamedTuple):
    """What one point measures besides its warm-up (:func:`measure_loader_point`)."""

    stall: bool
    throughput: bool
    batch_size: int | None
    floor: float | None
    #: Called with the warm consumer before the stall (a stall-only point): the memory pass at the pick
    #: rides on the workers the stall starts anyway (:func:`stagebench.loader._costs.memory_pass`).
    during: Callable[[Any], None] | None = None
    #: A window in turns: it closes at its shortest (``min_window_s``, ``min_batches`` and three rounds of the
    #: workers) wherever ``precision`` may close a window at all (:func:`stagebench.loader._turns.run_turns`).
    shortest: bool = False


#: Seconds between two checks of a window's interval (each reads the arrivals so far).
_CHECK_S = 0.05


def _polls(cons: _Consumer, errors: _SpdlErrors, row: PointDraft, *, check_workers_every: int) -> Iterator[float]:
    """The time at each poll of a warm-up or a window, until the loader fails (:func:`_failed` puts its
    status and reason in ``row``, and the polls end). Its worker processes are checked every
    ``check_workers_every`` polls (reading each one's state costs more than a poll)."""
    polls = 0
    while True:
        now = time.perf_counter()
        polls += 1
        if _failed(cons, errors, row, check_workers=polls % check_workers_every == 0):
            return
        yield now


def _supervise(cons, eff, cfg, deadline, row: PointDraft, errors, plan: _Plan):
    """Warm-up, window, memory, epoch stall. Returns (outcome or None, hung)."""
    expected = max(1, eff.num_workers)
    t_start = time.perf_counter()
    seen: set = set()
    scanned = 0
    # --- warm-up: every worker delivered, and the minimum time passed
    for now in _polls(cons, errors, row, check_workers_every=20):
        if cons.finished:
            row.fail("failed", "the loader ended before warm-up was over (an empty dataset?)")
            return None, False
        ev = cons.events
        n = len(ev)
        for e in ev[scanned:n]:
            if e.epoch == 0:
                seen.add(e.pid if e.pid is not None else scanned)
            scanned += 1
        # untagged batches: count arrivals (torch delivers in order, round-robin)
        all_seen = len(seen) >= expected
        if all_seen and math.isnan(row.startup_s):
            row.startup_s = now - cons.t_begin  # built, started, every worker delivered
        warm = cfg.warmup_s if plan.throughput else 0.0  # the stall alone needs no steady state
        if n >= 2 and now - t_start >= warm and (all_seen or n >= 4 * expected + 2) and cons.others_ready():
            if not all_seen:
                row.note(f"only {len(seen)} of {expected} workers delivered during warm-up")
                row.startup_s = now - cons.t_begin
            row.warmup_s = now - cons.t_begin - row.startup_s
            break
        if now >= deadline:
            row.fail(
                "timeout",
                f"no steady state within {cfg.timeout_s:g}s: {n} batch(es) arrived, "
                f"{len(seen)} of {expected} workers delivered (a hung worker or a very slow start)",
            )
            return None, True
        time.sleep(_POLL_S)
    else:  # the loader failed (its status and reason are in the row)
        return None, False
    row.workers_seen = len(seen) if cons.events and cons.events[0].pid is not None else math.nan

    if not plan.throughput:  # the stall only (the search's pick): no window
        if plan.during is not None:
            plan.during(cons)
        hung = plan.stall and _measure_stall(cons, eff, cfg, deadline, row, errors, time.perf_counter())
        return None, hung

    outcome, hung = timed_window(cons, eff, cfg, deadline, row, errors, plan)
    if outcome is None:
        return None, hung
    # --- epoch stall
    return outcome, plan.stall and _measure_stall(cons, eff, cfg, deadline, row, errors, outcome.t1)


def timed_window(cons, eff, cfg, deadline, row: PointDraft, errors, plan: _Plan):
    """One steady-state window of ``cons``'s arrivals, then its CPU and memory. Returns (the
    :class:`Window` or None, hung).

    It closes once its interval is within ``cfg.precision`` (after ``cfg.min_window_s``; a window in turns,
    ``plan.shortest``, once it has an interval at all and lasts ``cfg.turn_gap_span`` times its longest wait
    between arrivals), or once the interval lies wholly under ``plan.floor`` (it cannot be the answer), or at
    ``cfg.budget_s`` (a window in turns: ``cfg.turn_budget_s``, where longer).
    """
    mirror = cons.mirror if cons.cid is not None else None
    t0 = time.perf_counter()
    i0 = len(cons.events)
    # a ranked sweep: the host's cores, every rank's processes (one host: the leader reads them itself)
    pids = cons.worker_pids() + ([] if mirror is None else mirror.processes + cons.others_pids)
    snap0 = TreeSnapshot.take(pids, opening=True)
    min_gaps = cfg.fewest_batches(eff.num_workers)
    # a window in turns may run on past the search's budget while a stall inside it asks for more (at
    # precision 0, the protocol kept for comparisons, every window runs the budget)
    longer = plan.shortest and cfg.precision > 0
    end = t0 + (max(cfg.budget_s, cfg.turn_budget_s) if longer else cfg.budget_s)
    reserve = min(5.0, 0.1 * cfg.timeout_s)
    next_check = t0 + cfg.min_window_s
    waits = _Waits(cons.events, max(0, i0 - 1))

    def enough(got: int) -> bool:
        """This rank's window holds what timing it needs, and (asked only then) every other rank's too."""
        return got >= min_gaps and (mirror is None or min(mirror.counts(cons.cid, t0)) > min_gaps)

    def outlasts_stalls(now: float) -> bool:
        """A window in turns: ``cfg.turn_gap_span`` times its longest wait between arrivals (one round's ratio
        must outlast the host's stalls); any other window: always."""
        return not plan.shortest or now - t0 >= cfg.turn_gap_span * waits.longest(now)

    for now in _polls(cons, errors, row, check_workers_every=5):
        got = len(cons.events) - i0 - 1
        if now >= end and enough(got):
            break
        if got >= min_gaps and now >= next_check and (cfg.precision > 0 or plan.floor):
            next_check = now + _CHECK_S
            if _settled(cons.events, t0, now, eff, cfg, plan) and enough(got) and outlasts_stalls(now):
                break
        if now >= deadline - reserve:
            last = cons.events[-1].t if cons.events else t0
            if got < 1 or now - last > max(1.0, 0.5 * (now - t0)):
                row.fail("timeout", f"the loader stalled: no batch for {now - last:.1f}s (a hung worker?)")
                return None, True
            row.note(f"window cut at the point's deadline after {got} batches")
            break
        time.sleep(min(0.02, max(0.0, end - now)) or _POLL_S)
    else:  # the loader failed (its status and reason are in the row)
        return None, False
    t1 = time.perf_counter()
    snap1 = TreeSnapshot.take(pids)
    # memory, read while the workers are alive and the window is closed
    mem = tree_memory_mb(cons.worker_pids())
    others: tuple[WindowShare | None, ...] = ()
    slices = 0
    if mirror is not None:  # each other rank's share of this same window, cut as this rank's will be
        rnd = max(1, eff.num_workers)
        slices = share_slices(cons.events, t0, t1, rnd=rnd, max_groups=cfg.max_groups)
        got_rates, failed = mirror.rates(
            cons.cid, t0, t1, {"rnd": rnd, "batch_size": plan.batch_size, "slices": slices}
        )
        if failed is not None:  # a rank's loader failed during the window: the host has no figure for it
            row.fail(*failed)
            return None, False
        others = tuple(WindowShare.from_json(d) for d in got_rates)
    return Window(t0, t1, snap0, snap1, mem, others, slices), False


class _Waits:
    """The longest wait between two arrivals of ``events`` from index ``i0`` on, read as they land."""

    def __init__(self, events: Sequence[_Event], i0: int):
        self.events = events
        self.seen = i0  # the index of the latest arrival read
        self.gap = 0.0

    def longest(self, now: float) -> float:
        """The longest wait so far, the one still open at ``now`` included."""
        ev = self.events
        n = len(ev)
        if n == 0:
            return 0.0
        for i in range(self.seen + 1, n):
            self.gap = max(self.gap, ev[i].t - ev[i - 1].t)
        self.seen = max(self.seen, n - 1)
        return max(self.gap, now - ev[n - 1].t)


def _settled(
    events: Sequence[_Event], t0: float, now: float, eff: LoaderKnobs, cfg: LoaderSweepConfig, plan: _Plan
) -> bool:
    """Whether the window may close now: its interval within ``cfg.precision``, or wholly under the floor."""
    got = window_rate(
        list(events),
        t0,
        now,
        rnd=max(1, eff.num_workers),
        batch_size=plan.batch_size,
        max_groups=cfg.max_groups,
        confidence=cfg.confidence,
    )
    rate, lo, hi = got.get("samples_per_s"), got.get("samples_per_s_low"), got.get("samples_per_s_high")
    if not rate or lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return False
    if cfg.precision > 0 and (plan.shortest or (hi - lo) / 2 <= cfg.precision * rate):
        return True
    return plan.floor is not None and hi < plan.floor


def _measure_stall(
    cons, eff, cfg, deadline, row: PointDraft, errors, t1, then: Callable[[Any], None] | None = None
) -> bool:
    """Run to epoch boundaries, its seconds in ``row.stall_phase_s`` (the point's time split).
    Returns True when the loader hung doing so.

    ``then``: called with the consumer once the stall is read. Under epoch control the last epoch then
    runs on, and ``then`` runs on the workers it started afresh (workers that are not persistent start
    again at every epoch): the memory pass reads their early growth there rather than on a loader started
    for it alone (a second start-up: 1 s a search on the slow-start bench). Without epoch control it is
    called first, on the warm loader as it is."""
    t_stall = time.perf_counter()
    try:
        ctl = cons.control
        if ctl is not None:
            cons.stall_batches = cfg.stall_epoch_batches or max(4, 2 * eff.num_workers)
            cons.max_epochs = 1 + cfg.stall_epochs
            cons.open_last = then is not None
            ctl.end()
            while not cons.finished:
                if _failure(cons, errors):
                    return False
                if then is not None and cons.events and cons.events[-1].epoch == cons.max_epochs - 1:
                    then(cons)  # the last epoch's first batch is in: its stall is read, its workers fresh
                    return False
                if time.perf_counter() >= deadline:
                    last = cons.events[-1].t if cons.events else t1
                    row.note(f"{STALL_NOT_MEASURED}the epochs did not end before the point's deadline")
                    if time.perf_counter() - last > 1.0:
                        row.fail(
                            "timeout",
                            f"the loader stalled at an epoch end: no batch for {time.perf_counter() - last:.1f}s",
                        )
                        return True
                    return False
                time.sleep(0.01)
            return False
        # No epoch control: wait for a natural boundary if one is near.
        if then is not None:
            then(cons)
        start_epoch = cons.events[-1].epoch if cons.events else 0
        wait = cfg.stall_wait_s
        sized = False
        with suppress(TypeError):  # a loader without a length: no epoch end to foresee
            per_epoch = len(cons.loader)
            sized = True
            in_epoch = sum(1 for e in cons.events if e.epoch == start_epoch)
            rate = _rough_batch_rate(cons.events)
            if rate > 0:
                est = max(0, per_epoch - in_epoch) / rate
                if est > wait:
                    row.note(
                        f"{STALL_NOT_MEASURED}an epoch ends in about {est:.0f}s, after the {wait:g}s waited for one"
                    )
                    return False
        until = min(deadline, time.perf_counter() + wait)
        while time.perf_counter() < until:
            if _failure(cons, errors) or cons.finished:
                return False
            ev = cons.events
            if ev and ev[-1].epoch > start_epoch:
                return False
            time.sleep(0.01)
        if not any(e.epoch > 0 for e in cons.events):
            unsized = "" if sized else " (the loader has no length, so its epoch's end could not be foreseen)"
            row.note(f"{STALL_NOT_MEASURED}no epoch ended in the {wait:g}s waited for one{unsized}")
        return False
    finally:
        row.stall_phase_s = time.perf_counter() - t_stall


def _fill(
    row: PointDraft,
    cons: _Consumer,
    outcome: Window | None,
    eff: LoaderKnobs,
    batch_size: int | None,
    cfg: LoaderSweepConfig,
) -> None:
    """Throughput, interval, stall, cores and memory from the consumer's events."""
    ev = list(cons.events)
    if ev:
        row.time_to_first_batch_s = ev[0].t - cons.t_begin
        row.set(startup_split(ev, cons.t_iter, cons.wall_offset))
    me = os.getpid()
    threads = [e.threads for e in ev[:4096] if e.threads >= 0 and (e.pid != me or eff.num_workers == 0)]
    if threads:
        row.worker_threads = max(threads)

    # epoch boundaries: last batch of epoch k -> first batch of epoch k+1
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    for e in ev:
        first.setdefault(e.epoch, e.t)
        last[e.epoch] = e.t
    stalls = [first[k] - last[k - 1] for k in sorted(first) if k >= 1 and (k - 1) in last]
    if stalls:
        row.epoch_stall_s = statistics.fmean(stalls)

    if outcome is None:
        return
    t0, t1, snap0, snap1, mem = outcome.t0, outcome.t1, outcome.opened, outcome.closed, outcome.memory_mb
    window = t1 - t0
    row.window_s = window
    got = window_rate(
        ev,
        t0,
        t1,
        rnd=max(1, eff.num_workers),
        batch_size=batch_size,
        max_groups=cfg.max_groups,
        confidence=cfg.confidence,
    )
    row.set(got)
    if not got.get("samples_per_s"):
        if row.status == "ok":
            row.fail("failed", "no batches arrived in the steady-state window")
        return
    if outcome.others:
        rnd = max(1, eff.num_workers)
        mine = window_share(ev, t0, t1, time.perf_counter(), rnd=rnd, batch_size=batch_size, slices=outcome.slices)
        _host_figures(row, mine, outcome.others, cfg.confidence)
    row.cores_used = snap1.cpu_since(snap0) / window
    row.disk_read_mb_s = snap1.read_bytes_since(snap0) / window / 2**20
    row.mem_main_mb, row.mem_pss_mb = mem["main"], mem["pss"]
    row.mem_uss_mb, row.mem_workers_mb = mem["uss"], mem["workers"]
