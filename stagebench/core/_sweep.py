"""Sweep one stage over harness x executor x concurrency, with its ceiling.

Each point is written to disk the moment it is measured. A point that shows
the stage cannot run this way (skipped), never gets going (timeout), or fails
on every item skips the remaining levels of that executor with the reason:
repeating a 60 s hang at six levels helps nobody. A crash does not: running
out of memory at 32 processes says nothing about 4.

Process points are the expensive ones (each level starts more interpreters):
a stage keeps one pool, grown level by level and shared with its ceiling
(:class:`~stagebench.core._executors.WorkerPool`), and the diagnosis measures all
its stages' process points level by level on one pool
(:func:`sweep_process_points`). A process curve ends once it stops rising
(:func:`_watch_plateau`), and none is measured where its thread curve shows
processes cannot win (:func:`_threads_linear`, :func:`_threads_at_ceiling`,
:func:`_cores_bind`); a GIL-free stage's thread curve ends once a level gains
neither throughput nor CPU over a smaller one (:func:`_threads_cores_bound`), and a stage that holds
the GIL for half of each call or more once a level gains nothing (:func:`_threads_gil_bound`).

A stage point closes early once it cannot matter (:data:`CANNOT_MATTER`); no-op
ceilings may close from half the minimum window; head-to-head windows are read
to ±10% (:data:`~stagebench.core._config.PAIRED_PRECISION`): each is one sample of a ratio.

Last, when the curves alone would recommend processes by less than 1.5x,
both executors are measured again in turns at their best levels
(:meth:`StageSweep.run_paired`; why: :mod:`stagebench.core._paired`, docs/method.md#rounds-in-turns).
"""

from __future__ import annotations

import contextlib
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import NamedTuple, TypedDict, Unpack

import cloudpickle
import pandas as pd

from stagebench._numbers import SourceItems, finite, fmt_above, fmt_share_of
from stagebench.core import _paired
from stagebench.core._config import CANNOT_MATTER, MeasureConfig, SweepConfig, in_turns_precision
from stagebench.core._curves import StageRows
from stagebench.core._executors import WorkerPool, async_identity, identity, is_coroutine_callable
from stagebench.core._measure import measure_stage, payload_bytes, skipped
from stagebench.core._progress import Progress
from stagebench.core._resources import usable_cores
from stagebench.core._rounds import in_turns
from stagebench.core._spdl_harness import deferred_teardown
from stagebench.core._stage_draft import StageDraft
from stagebench.runs._results import RowWriter
from stagebench.runs._schema import STAGE_COLUMNS

__all__ = ["sweep_stage", "plan_points", "PlannedPoint", "StageOptions", "StageSweep", "sweep_process_points"]

_STOP_STATUSES = ("skipped", "timeout", "failed")
_PLATEAU = "not measured: process throughput stopped rising"
_THREADS_PLATEAU = "not measured: thread throughput stopped rising"
_NOT_NEAR = "not measured: this level's process throughput is more than 5% below the best so far"
_LINEAR = 0.95  # threads within 5% of linear scaling: processes cannot win by more
_AT_CEILING = 0.9  # threads within 10% of the thread no-op ceiling: the process ceiling is lower still
_GIL_FREE = 0.10  # a stage's GIL share (probe, upper quartile) at or under which the GIL is not its limit
_GIL_HELD = 0.5  # a stage's GIL share (probe, lower quartile) from which threads can give at most 2x one
_CORES_BUSY = 0.75  # ... and threads keeping this share of the usable cores busy: the cores bind
_SHARED_REASON = "shared: measured once for all stages (a no-op on threads or the event loop does not touch the items)"
# A process no-op ships each item to a worker and back. Up to this pickled size its cost is per item,
# not per byte, so stages whose items are this small share their process ceilings.
_SMALL_PAYLOAD = 16 * 1024
_SHARED_PROCESS_REASON = (
    "shared: measured once for the stages whose items pickle to at most 16 KiB "
    "(a process no-op's cost is per item at that size, not per byte)"
)


def _executors_for(fn: Callable, config: SweepConfig) -> tuple[str, ...]:
    if is_coroutine_callable(fn):
        return ("async",)  # coroutines run on the event loop, never on a pool
    out = tuple(e for e in config.executors if e != "async")
    return out or ("thread",)


class PlannedPoint(NamedTuple):
    """One point a stage's sweep plans: the stage itself or its harness's no-op ceiling (``role``), in a
    harness, on an executor, at a concurrency. A named tuple: equal to, and hashed as, the same values
    read back from a row, which is how a sweep knows what it measured already."""

    role: str
    harness: str
    executor: str
    concurrency: int


def plan_points(fn: Callable, config: SweepConfig) -> list[PlannedPoint]:
    """The points of a stage's sweep, in measuring order."""
    pts = []
    for harness in config.harnesses:
        for ex in _executors_for(fn, config):
            for c in config.concurrency:
                pts.append(PlannedPoint("stage", harness, ex, c))
                if config.ceiling:
                    pts.append(PlannedPoint("ceiling", harness, ex, c))
    return pts


class StageOptions(TypedDict, total=False):
    """What a stage's sweep may be given besides the stage and its inputs (each optional)."""

    name: str | None
    """The stage's name in rows and reports (default: the callable's name)."""
    config: SweepConfig | None
    """What to sweep and how to measure (default: :class:`SweepConfig`)."""
    writer: RowWriter | None
    """Where each row is appended as it is measured."""
    progress: Progress | None
    on_row: Callable[[StageDraft], None] | None
    """Called with each point as it lands."""
    shared_ceilings: dict[tuple[str, str, int], StageDraft] | None
    """Ceilings measured once for several stages (:func:`sweep_stage`)."""
    items_per_input: float | None
    """Source items one call stands for (after a batching step; default 1): the skip reasons state rates
    in source items/s, as the report does."""


def sweep_stage(fn: Callable, inputs: Sequence, **options: Unpack[StageOptions]):
    """Measure ``fn`` at every planned point; return a tidy DataFrame (one row per point).

    Rows are appended to ``writer`` as they are measured. ``KeyboardInterrupt``
    propagates after the current point's workers are torn down; every row
    measured before it is already on disk.

    ``shared_ceilings``: pass the same dict to the sweeps of several stages and
    each ceiling (harness, executor, concurrency) is measured once: a no-op on
    threads or the event loop only passes references, and a process no-op's
    cost is per item up to ``_SMALL_PAYLOAD`` (larger items measure their own).
    Later stages get a copy of the point (``elapsed_s`` 0, the original
    ``started_at``, a ``reason`` that says so).
    """
    sweep = StageSweep(fn, inputs, **options)
    # deferred_teardown: SPDL's ~0.2 s of tear-down per point overlaps the next point's start
    with contextlib.ExitStack() as stack, deferred_teardown():
        pools = _pools(stack, [fn]) if "process" in _executors_for(fn, sweep.cfg) else {}
        sweep.run(sweep.points, pools.get(id(fn)))
        sweep.run_paired(pools.get(id(fn)))
    return sweep.frame()


class StageSweep:
    """One stage's sweep: its planned points, the rows measured so far, and the rules that stop a curve.

    :func:`sweep_stage` runs all its points in order. The diagnosis runs each
    stage's thread / async points first and then every stage's process points
    level by level on one shared pool (:func:`sweep_process_points`); the
    rules see the same rows either way.
    """

    def __init__(self, fn: Callable, inputs: Sequence, **options: Unpack[StageOptions]) -> None:
        self.fn, self.cfg = fn, options.get("config") or SweepConfig()
        self.name = options.get("name") or getattr(fn, "__name__", None) or type(fn).__name__
        self.inputs = list(inputs)
        self.writer, self.progress = options.get("writer"), options.get("progress")
        self.on_row, self.shared = options.get("on_row"), options.get("shared_ceilings")
        self.src = SourceItems(options.get("items_per_input"))
        self.payload = payload_bytes(self.inputs) if self.inputs else math.nan
        self.noop = async_identity if is_coroutine_callable(fn) else identity
        m = self.cfg.measure
        self.ceiling_cfg = m.for_noop(self.cfg.ceiling_budget_s) if self.cfg.ceiling else m
        self.paired_cfg = replace(m, precision=in_turns_precision(m.precision))
        self.points = plan_points(fn, self.cfg)
        self.rows: list[StageDraft] = []
        self.stopped: dict[tuple[str, str, str], str] = {}
        self._plateaus: dict[str, tuple[StageDraft, int]] = {}
        #: The stage's GIL share as a direct probe read it (its upper quartile), when the caller probed
        #: it after the thread points (:func:`_cores_bind`); None: not probed.
        self.gil_high: float | None = None
        #: ... and its lower quartile (:func:`_threads_gil_bound`); None: not probed.
        self.gil_low: float | None = None
        #: Harnesses whose thread curve was judged (before its first process point).
        self._linear_checked: set[str] = set()

    def frame(self):
        return pd.DataFrame([r.as_row() for r in self.rows], columns=list(STAGE_COLUMNS))

    def remaining(self, executor: str) -> list[PlannedPoint]:
        """This executor's planned points not measured (or recorded as skipped) yet."""
        done = {(r.role, r.harness, r.executor, r.concurrency) for r in self.rows}
        return [p for p in self.points if p.executor == executor and p not in done]

    def process_pending(self) -> bool:
        """Whether a process point of this stage is still to be measured (not ruled out by its thread curve)."""
        for _, harness, ex, _ in self.remaining("process"):
            self._judge_threads(harness)
            if ("stage", harness, ex) not in self.stopped:
                return True
        return False

    def _judge_threads(self, harness: str) -> None:
        if self.cfg.process_flat_levels and harness not in self._linear_checked:
            self._linear_checked.add(harness)
            why = (
                _threads_linear(self.rows, harness)
                or _threads_at_ceiling(self.rows, harness, self.src)
                or _cores_bind(self.rows, harness, self.gil_high)
            )
            if why:
                self.stopped[("stage", harness, "process")] = self.stopped[("ceiling", harness, "process")] = why

    def run(self, points: Sequence[PlannedPoint], pool: WorkerPool | None) -> None:
        """Measure (or record as skipped) ``points``, in order; ``pool`` serves the process points."""
        cfg, stopped = self.cfg, self.stopped
        for role, harness, ex, c in points:
            if ex == "process":
                self._judge_threads(harness)
            if role == "ceiling" and (unserved := self._stage_unmeasured(harness, ex, c)):
                self._record(skipped(self.name, role, ex, harness, c, unserved, self.payload))
                continue
            shared = self.shared if role == "ceiling" and (ex != "process" or self.payload <= _SMALL_PAYLOAD) else None
            if shared is not None and (harness, ex, c) in shared and (role, harness, ex) not in stopped:
                orig = shared[(harness, ex, c)]
                why = _SHARED_PROCESS_REASON if ex == "process" else _SHARED_REASON
                reason = "; ".join(r for r in (why, orig.reason) if r)
                row = replace(orig, stage=self.name, payload_bytes=self.payload, elapsed_s=0.0, reason=reason)
            else:
                row = self._point(role, harness, ex, c, pool)
                if shared is not None and row.status == "ok":
                    shared[(harness, ex, c)] = row
                if role == "stage" and ex == "process" and cfg.process_flat_levels:
                    _watch_plateau(row, harness, self._plateaus, stopped, cfg.process_flat_levels, src=self.src)
                if role == "stage" and ex == "thread" and cfg.process_flat_levels:
                    ended = _threads_cores_bound(row, self.rows, harness, self.gil_high, self.src) or (
                        _threads_gil_bound(row, self.rows, harness, self.gil_low, self.src)
                    )
                    if ended:
                        stopped[("stage", harness, "thread")] = ended
                if role == "stage" and ex == "process" and cfg.process_ceilings == "near_best":
                    _skip_ceiling_unless_near_best(row, self.rows, harness, stopped, self.src)
            self._record(row)

    def _point(self, role: str, harness: str, ex: str, c: int, pool: WorkerPool | None) -> StageDraft:
        """One point measured, or skipped where its curve stopped; a point that did not measure stops it."""
        key = (role, harness, ex)
        if key in self.stopped:
            return skipped(self.name, role, ex, harness, c, self.stopped[key], self.payload)
        if self.progress is not None:
            self.progress.start(f"{self.name} | {role} {harness}/{ex} c={c}")
        row = measure_stage(
            self.fn if role == "stage" else self.noop,
            self.inputs,
            executor=ex,
            concurrency=c,
            config=self._stage_cfg(harness) if role == "stage" else self.ceiling_cfg,
            name=self.name,
            role=role,
            harness=harness,
            payload=self.payload,
            pool=pool if ex == "process" else None,
        )
        if row.status == "skipped":
            self.stopped[key] = row.reason
        elif row.status in _STOP_STATUSES:
            self.stopped[key] = f"not measured: {row.status} at concurrency {c} ({row.reason})"
        return row

    def _stage_unmeasured(self, harness: str, ex: str, c: int) -> str | None:
        """Why the ceiling at this level serves no stage point (its reason), or None where it does.

        A ceiling is read against the stage's point at its own level; where that point did not measure
        (a stage that cannot be pickled, a curve that ended, a timeout), measuring the no-op there costs
        a window, up to its timeout, and answers nothing.
        """
        at = PlannedPoint("stage", harness, ex, c)
        row = next((r for r in reversed(self.rows) if (r.role, r.harness, r.executor, r.concurrency) == at), None)
        if row is None or row.status == "ok":
            return None
        if row.status == "skipped":
            return row.reason
        return f"not measured: its stage's point at this level ended {row.status} ({row.reason})"

    def _stage_cfg(self, harness: str) -> MeasureConfig:
        """The next stage point's measuring: it may close early once it cannot matter (:data:`CANNOT_MATTER`)."""
        lows = [
            r.qps_low
            for r in self.rows
            if r.role == "stage" and r.harness == harness and r.status == "ok" and finite(r.qps_low)
        ]
        if not lows or not self.cfg.measure.precision > 0:
            return self.cfg.measure
        return replace(self.cfg.measure, below=CANNOT_MATTER * max(lows))

    def paired_plan(self) -> tuple[str, int, int] | None:
        """(harness, thread level, process level) of the head-to-head its curves call for, or None."""
        if not self.cfg.paired_rounds or "process" not in _executors_for(self.fn, self.cfg):
            return None
        sr = StageRows(self.frame())
        harness = sr.recommendation_harness()
        levels = _paired.plan(sr, harness) if harness else None
        return (harness, *levels) if harness and levels else None

    def run_paired(self, pool: WorkerPool | None) -> None:
        """The head-to-head (:mod:`stagebench.core._paired`), when the curves alone would pick processes by a small margin.

        Windows in the order T P P T, ``paired_rounds`` times, at each
        executor's best level of the recommendation's harness; ``pool`` serves
        the process windows, at its size if that is larger than their level
        (:attr:`WorkerPool.keep_larger`: c calls in flight either way, and no
        fresh pool to start). A window that does not measure ends it (the
        pairs before it still count).
        """
        planned = self.paired_plan()
        if planned is None:
            return
        harness, t_level, p_level = planned
        at, rounds = {"thread": t_level, "process": p_level}, self.cfg.paired_rounds

        def executors(i: int) -> tuple[str, ...]:  # none where the last round cannot turn it
            last = 0 < i == rounds - 1 and _paired.threads_led_every_pair(self.rows[-4 * i :])
            return () if last else ("thread", "process")

        if pool is not None:  # a head-to-head reads throughput only: no fresh pool to go down a level
            pool.keep_larger = True
        try:
            for ex in (ex for _, order in in_turns(executors, rounds, there_and_back=rounds) for ex in order):
                if self.progress is not None:
                    self.progress.start(f"{self.name} | head-to-head {harness}/{ex} c={at[ex]}")
                row = measure_stage(
                    self.fn,
                    self.inputs,
                    executor=ex,
                    concurrency=at[ex],
                    config=self.paired_cfg,
                    name=self.name,
                    role="paired",
                    harness=harness,
                    payload=self.payload,
                    pool=pool if ex == "process" else None,
                )
                self._record(row)
                if row.status != "ok":
                    return
        finally:
            if pool is not None:
                pool.keep_larger = False

    def _record(self, row: StageDraft) -> None:
        self.rows.append(row)
        if self.writer is not None:
            self.writer.write(row.as_row())
        if self.progress is not None:
            self.progress.point(row)
        if self.on_row is not None:
            self.on_row(row)


def sweep_process_points(
    sweeps: Sequence[StageSweep], paired_needless: Callable[[Sequence[StageSweep]], dict[str, str]] | None = None
) -> None:
    """The remaining (process) points of several stages, level by level, on one shared pool.

    Why: a pool grown stage by stage starts its workers again for every stage,
    and the workers of one stage would serve the next just as well. Level by
    level, every stage's point at c runs on the same c workers, so the pool
    grows to the top level once. Stages whose process curve was ruled out are
    skipped with their reason; a stage that cannot be pickled, or pickles
    larger than 1 MiB, runs on pools of its own (:func:`_pools`). Each harness
    is its own pass: its levels start again from the lowest. Then each
    stage's head-to-head, if its curves call for one (:meth:`StageSweep.run_paired`),
    except where ``paired_needless`` (given every stage's curves) says why it is not
    needed: stage name -> reason (the diagnosis: its result could not change the
    pipeline's settings).
    """
    todo = {id(s): s.remaining("process") for s in sweeps}
    with contextlib.ExitStack() as stack, deferred_teardown():
        pools = _pools(stack, [s.fn for s in sweeps if s.process_pending()])
        for harness in dict.fromkeys(p.harness for s in sweeps for p in todo[id(s)]):
            levels = sorted({p.concurrency for s in sweeps for p in todo[id(s)] if p.harness == harness})
            for c in levels:
                for s in sweeps:
                    pts = [p for p in todo[id(s)] if p.harness == harness and p.concurrency == c]
                    if pts:
                        s.run(pts, pools.get(id(s.fn)))
        needless = paired_needless(sweeps) if paired_needless is not None else {}
        for s in sweeps:
            if s.name not in needless:
                s.run_paired(pools.get(id(s.fn)))


def _threads_linear(rows: list[StageDraft], harness: str) -> str | None:
    """Why processes cannot change this stage's answer, or None.

    When threads scale within 5% of linearly from the first level to the top
    one, a process curve cannot beat them by more than 5%: a worker process is
    at most as fast as one thread alone (the c=1 point), and within 5% the
    recommendation takes threads anyway.
    """
    pts = [r for r in rows if r.role == "stage" and r.executor == "thread" and r.harness == harness]
    if len(pts) < 2 or any(r.status != "ok" or not r.qps > 0 for r in pts):
        return None
    first, top = pts[0], pts[-1]
    if top.qps < max(r.qps for r in pts):
        return None
    share = (top.qps / first.qps) / (top.concurrency / first.concurrency)
    if share < _LINEAR:
        return None
    return (
        f"not measured: threads scale linearly to the top of the grid ({share:.0%} of {top.concurrency}x "
        f"c={first.concurrency}), so processes cannot beat them beyond 5% (a worker process is at most as "
        "fast as one thread alone); process_flat_levels=0 or STAGEBENCH_PROCESS_FLAT_LEVELS=0 measures them"
    )


def _threads_at_ceiling(rows: list[StageDraft], harness: str, src: SourceItems = SourceItems()) -> str | None:
    """Why processes cannot change this stage's answer because threads already reach the harness's limit.

    The thread no-op ceiling is the most this harness delivers with any thread
    work at all. A process executor pays the same per-item scheduling plus the
    IPC (pickling, the pool's queue threads), so its no-op ceiling is lower. When the
    stage's best thread point reaches 90% of the thread ceiling (the median over
    levels: one low reading must not decide), the stage is overhead-bound and
    processes cannot beat threads.
    """
    stage = [r.qps for r in _ok_points(rows, harness, "thread") if r.qps > 0]
    ceilings = sorted(r.qps for r in _ok_points(rows, harness, "thread", "ceiling") if r.qps > 0)
    if not stage or len(ceilings) < 2:
        return None
    ceiling, best = statistics.median(ceilings), max(stage)
    if best < _AT_CEILING * ceiling:
        return None
    return (
        f"not measured: threads already deliver {fmt_share_of(best / ceiling)} the harness's thread no-op ceiling "
        f"({src.rate(best):,.0f} vs {src.rate(ceiling):,.0f} items/s, the median over levels{fmt_above(best / ceiling)}): the stage is "
        "overhead-bound, and a "
        "process executor adds IPC to the same per-item overhead, so it cannot beat threads; "
        "process_flat_levels=0 or STAGEBENCH_PROCESS_FLAT_LEVELS=0 measures them"
    )


def _cores_bind(rows: list[StageDraft], harness: str, gil_high: float | None) -> str | None:
    """Why processes cannot change this stage's answer because the cores bind it, not the GIL.

    A worker process relieves only the GIL the stage itself holds in the main
    process. When a probe read that under :data:`_GIL_FREE` of each call and the
    stage's best thread point already keeps :data:`_CORES_BUSY` of the usable
    cores busy, the cores are what threads run out of: processes bring no more
    cores, and add pickling to the same CPU work (docs/method.md).
    """
    if gil_high is None or not gil_high <= _GIL_FREE:
        return None
    best = max(_ok_points(rows, harness, "thread"), key=lambda r: r.qps, default=None)
    cores = usable_cores()
    if best is None or not finite(best.cores_used) or best.cores_used < _CORES_BUSY * cores:
        return None
    return (
        f"not measured: the stage holds the GIL for at most {gil_high:.0%} of a call (its probe) and threads "
        f"already keep {best.cores_used:.1f} of {cores} usable cores busy (c={best.concurrency}): the cores "
        "bind, not the GIL, and worker processes bring no more cores; "
        "process_flat_levels=0 or STAGEBENCH_PROCESS_FLAT_LEVELS=0 measures them"
    )


def _ok_points(rows: list[StageDraft], harness: str, executor: str, role: str = "stage") -> list[StageDraft]:
    """The points of ``role`` on ``executor`` in ``harness`` that measured (status ok)."""
    return [r for r in rows if r.role == role and r.executor == executor and r.harness == harness and r.status == "ok"]


def _threads_cores_bound(
    row: StageDraft, rows: list[StageDraft], harness: str, gil_high: float | None, src: SourceItems = SourceItems()
) -> str | None:
    """Why the thread levels above ``row`` are not measured, or None.

    When a probe read the stage GIL-free (at most :data:`_GIL_FREE` of a call)
    and ``row``, with more threads than the best thread level before it, got
    neither more throughput beyond noise nor more CPU (its cores used within 5%
    of that level's), its threads have run out of something more threads do not
    bring: the cores, or a lock or resource of its own. The curve cannot rise
    again. (A stage that holds the GIL: :func:`_threads_gil_bound`; a stage
    that waits is not probed and keeps its curve.)
    """
    if gil_high is None or not gil_high <= _GIL_FREE or (best := _no_gain(row, rows, harness)) is None:
        return None
    used, had = row.cores_used, best.cores_used
    if not used <= _SAME_CORES * had:  # NaN (not read) too
        return None
    return (
        f"{_THREADS_PLATEAU} ({row.concurrency} threads used {used:.1f} cores, no more than "
        f"{best.concurrency} threads' {had:.1f}, within noise of {src.rate(best.qps):,.0f} items/s, and the stage "
        f"holds the GIL for at most {gil_high:.0%} of a call): more threads get no more of the cores, and only "
        "queue for them; process_flat_levels=0 or STAGEBENCH_PROCESS_FLAT_LEVELS=0 measures every level"
    )


def _threads_gil_bound(
    row: StageDraft, rows: list[StageDraft], harness: str, gil_low: float | None, src: SourceItems = SourceItems()
) -> str | None:
    """Why the thread levels above ``row`` are not measured, or None.

    When a probe read that the stage holds the GIL for at least :data:`_GIL_HELD`
    of each call, threads together can run at most 1/share times as fast as one
    (the GIL's own bound, at most 2x here), and two calls in flight already
    overlap all of one call's GIL-free part. Once ``row``, with more threads than
    the best level before it, is not faster beyond noise, more threads only
    queue for the GIL: the curve cannot rise again, and processes are what can
    (they are measured as before).
    """
    if gil_low is None or not gil_low >= _GIL_HELD or (best := _no_gain(row, rows, harness)) is None:
        return None
    return (
        f"{_THREADS_PLATEAU} (c={row.concurrency} ran within noise of, or under, c={best.concurrency}'s "
        f"{src.rate(best.qps):,.0f} items/s, and the stage holds the GIL for at least {gil_low:.0%} of a "
        "call): more threads only wait for the GIL; process_flat_levels=0 or STAGEBENCH_PROCESS_FLAT_LEVELS=0 "
        "measures every level"
    )


def _no_gain(row: StageDraft, rows: list[StageDraft], harness: str) -> StageDraft | None:
    """The best thread level measured before ``row``, where ``row`` has more threads and is not faster beyond
    noise; else None."""
    if row.status != "ok" or not row.qps > 0:
        return None
    best = max(_ok_points(rows, harness, "thread"), key=lambda r: r.qps, default=None)
    if best is None or _beats(row, best) or not row.concurrency > best.concurrency:
        return None
    return best


def _beats(new: StageDraft, best: StageDraft) -> bool:
    """``new`` is faster than ``best`` beyond noise: 5% higher and, with intervals, not overlapping."""
    if not new.qps > 1.05 * best.qps:
        return False
    lo, hi = new.qps_low, best.qps_high
    return not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi


_SATURATED = 0.8  # share of the usable cores in use at which one level without gain ends a process curve
_SAME_CORES = 1.05  # a level whose cores used are within this of a fewer-thread level's got no more CPU


def _watch_plateau(
    row: StageDraft,
    harness: str,
    plateaus: dict[str, tuple[StageDraft, int]],
    stopped: dict[tuple[str, str, str], str],
    flat_levels: int,
    cores: float | None = None,
    src: SourceItems = SourceItems(),
) -> None:
    """Stop the process curve (and its ceilings) after ``flat_levels`` levels in a row without gain.

    One level is enough when that level already kept 80% of the usable cores
    busy: the cores are what limits it, and more processes only queue for them.
    """
    if row.status != "ok" or not row.qps > 0:
        return
    if harness not in plateaus or _beats(row, plateaus[harness][0]):
        plateaus[harness] = (row, 0)
        return
    best, flat = plateaus[harness][0], plateaus[harness][1] + 1
    plateaus[harness] = (best, flat)
    cores = cores or usable_cores()
    used = row.cores_used
    saturated = math.isfinite(used) and used >= _SATURATED * cores
    if flat >= flat_levels or saturated:
        why = (
            f"{row.concurrency} processes kept {used:.1f} of {cores} usable cores busy: the cores limit it"
            if saturated and flat < flat_levels
            else f"{flat} levels up to c={row.concurrency}"
        )
        stopped[("stage", harness, "process")] = (
            f"{_PLATEAU} ({why}, within noise of {src.rate(best.qps):,.0f} items/s at c={best.concurrency}; "
            "process_flat_levels=0 or STAGEBENCH_PROCESS_FLAT_LEVELS=0 measures every level)"
        )


_NEAR_BEST = 0.95  # must not be above _paired.WITHIN_BEST, or the recommended level could lose its ceiling


def _skip_ceiling_unless_near_best(
    row: StageDraft,
    rows: list[StageDraft],
    harness: str,
    stopped: dict[tuple[str, str, str], str],
    src: SourceItems = SourceItems(),
) -> None:
    """Skip this level's process ceiling when its stage point is more than 5% below the best so far.

    The analysis reads a process ceiling only at the curve's best level and at
    the smallest level within 5% of the best (the recommendation). Both are
    within 5% of the best *so far* when measured, so both keep their ceiling;
    the ceiling runs right after its stage point, on the same workers.
    """
    key = ("ceiling", harness, "process")
    if stopped.get(key, "").startswith(_NOT_NEAR):
        del stopped[key]
    if row.status != "ok" or not row.qps > 0:
        return
    best = max((r.qps for r in _ok_points(rows, harness, "process") if r.qps > 0), default=0.0)
    if row.qps < _NEAR_BEST * best and key not in stopped:
        stopped[key] = (
            f"{_NOT_NEAR} ({src.rate(row.qps):,.0f} items/s against {src.rate(best):,.0f} at a lower level): "
            "the analysis reads process ceilings only at the best level and the smallest within 5% "
            "of it; process_ceilings='all' or STAGEBENCH_PROCESS_CEILINGS=all measures every level"
        )


_SHARE_MAX_BYTES = 1 << 20  # a stage that pickles larger carries state (a model): it gets workers of its own


def _pools(stack: contextlib.ExitStack, fns: Sequence[Callable]) -> dict[int, WorkerPool]:
    """Process pools for these stages' process points (see WorkerPool), by ``id(fn)``.

    Stages that pickle small share one pool; one that pickles larger than
    1 MiB carries state (weights, tables) that every worker of a shared pool
    would hold, and that would count in the other stages' memory, so it gets
    its own. Stages that cannot be pickled are left out: their points run
    without a pool, so the first starts its own, records why and stops that
    curve. The pools close with ``stack``.
    """
    small: list[tuple[Callable, bytes]] = []
    out: dict[int, WorkerPool] = {}
    for fn in {id(f): f for f in fns}.values():  # the same callable twice: one entry (by identity: may be unhashable)
        try:
            blob = cloudpickle.dumps(fn)  # pickled once, up front
        except Exception:
            continue
        if len(blob) > _SHARE_MAX_BYTES:
            out[id(fn)] = stack.enter_context(WorkerPool(fn, fn_bytes=[blob]))
        else:
            small.append((fn, blob))
    if small:
        shared = stack.enter_context(WorkerPool(*(f for f, _ in small), fn_bytes=[b for _, b in small]))
        out.update((id(f), shared) for f, _ in small)
    return out
