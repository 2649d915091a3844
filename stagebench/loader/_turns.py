"""Loader settings measured in windows on loaders kept open: the search's, then again in turns.

Rounds in turns, and why: docs/method.md#rounds-in-turns. Opening a loader costs its workers' start-up
(seconds where the dataset is shipped to spawned workers, or workers import much), so each setting's
loader is built once, for its first window, and kept open, suspended, between its windows
(:class:`HeldLoaders`): the search's point opens it, the turns resume it, and the epoch stall at the
pick runs on it, so that a slow start-up is paid once per setting:

1. **Open** (the first window, a search's point): build it and warm it up as any point
   (:func:`stagebench.loader._point`'s protocol: every worker delivered, then the minimum warm-up),
   then time a window.
2. **Suspend**: the consumer stops taking batches; the workers fill their queues and idle.
3. **Resume** (later windows): take what the workers queued meanwhile (a DataLoader holds
   ``num_workers x prefetch_factor`` batches in flight; other loaders, what arrives at once), then
   one round of the workers, then time a window. A window in turns closes once it has an interval, after
   ``min_window_s``, ``min_batches`` and three rounds of the workers: it is one sample of a ratio whose
   interval comes from the rounds' spread, not from the window's own interval, so holding it open to ±10%
   buys the verdict little; but it must outlast the host's stalls, so it also lasts ``turn_gap_span``
   times its longest wait between arrivals, up to ``turn_budget_s`` (docs/method.md#_settingspy).

Rounds go on while the rule is not settled, at most ``tie_rounds``. Each window is a row with
``search_phase`` ``paired`` and its round in ``turn``, written as it is measured; the analysis reads the
rounds back from them, so ``stagebench report`` rebuilds the same decision. Which loaders the search
leaves open, and for how long, is the sweep's choice (:meth:`stagebench.loader._search._Sweep.prune`).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from stagebench.core._rounds import in_turns
from stagebench.loader._config import LoaderFactory, LoaderSweepConfig
from stagebench.loader._draft import PointDraft
from stagebench.loader._point import (
    _POLL_S,
    Window,
    _Consumer,
    _failed,
    _failure,
    _fill,
    _measure_stall,
    _Plan,
    _quiet_sigchld,
    _SpdlErrors,
    _supervise,
    _teardown,
    timed_window,
)
from stagebench.model._knobs import LoaderKnobs
from stagebench.runs._knobs import normalize_knobs

__all__ = ["HeldLoaders", "run_turns"]

#: A batch queued while its loader waited arrives within this of the one before it.
_QUEUED_GAP_S = 0.005


@dataclass
class _Held:
    """One setting's loader, open between its turns."""

    eff: LoaderKnobs
    shown: Mapping[str, bool | str]
    notes: list[str]
    cons: _Consumer
    errors: _SpdlErrors
    windows: int = 0


#: A suspended loader's workers count as idle once they took less than this share of one core together
#: over the last ``_IDLE_SPAN_S``, read every ``_IDLE_STEP_S``. Spans of 0.1 s read in steps of their own
#: length saw the workers idle up to 0.2 s after they were (11 waits on the slow-start bench summed 1.9 s).
#: A worker that waits on its queue takes no CPU at all, and one making a batch takes a share of a core
#: (25 ms of 50 with four workers on two cores), so 50 ms tell them apart.
_IDLE_SHARE = 0.1
_IDLE_SPAN_S = 0.05
_IDLE_STEP_S = 0.01


def _until_idle(pids: list[int], limit_s: float) -> None:
    """Wait, at most ``limit_s``, until suspended loaders' workers ``pids`` have filled their queues and
    idle, so that the batches they were making are not made inside the next window, of another setting
    (a DataLoader's ``num_workers x prefetch_factor`` batches in flight: 0.3-0.5 s of a 2-core host's CPU
    for the 4-worker JPEG loader, seconds with slow batches, and the window after it would share the cores
    with them). Loaders without worker processes (none, or threads) have nothing to wait for."""
    from stagebench.core._resources import cpu_seconds

    if not pids:
        return
    end = time.perf_counter() + limit_s
    seen = deque([(time.perf_counter(), cpu_seconds(pids))])
    while time.perf_counter() < end:
        time.sleep(_IDLE_STEP_S)
        now, cpu = time.perf_counter(), cpu_seconds(pids)
        seen.append((now, cpu))
        while len(seen) > 2 and now - seen[1][0] >= _IDLE_SPAN_S:  # the latest reading a span back
            seen.popleft()
        t0, cpu0 = seen[0]
        if now - t0 >= _IDLE_SPAN_S and cpu - cpu0 < _IDLE_SHARE * (now - t0):
            return


def _wait_for(cons: _Consumer, n: int, deadline: float, errors: _SpdlErrors) -> bool:
    """Until ``n`` events have arrived (False: a failure, the loader ended, or the deadline)."""
    while len(cons.events) < n:
        if _failure(cons, errors) or cons.finished or time.perf_counter() > deadline:
            return False
        time.sleep(_POLL_S)
    return True


def _resume(h: _Held, cfg: LoaderSweepConfig, backend: str, deadline: float) -> bool:
    """Open the gate, take what the workers queued while suspended, then one round of them."""
    cons = h.cons
    n0 = len(cons.events)
    cons.gate.set()
    if h.eff.num_workers > 0:
        if backend == "torch":  # each batch taken sends one index: the depth of the queue is known
            if not _wait_for(cons, n0 + h.eff.num_workers * (h.eff.prefetch_factor or 2), deadline, h.errors):
                return False
        else:  # what arrives at once was queued
            while True:
                n = len(cons.events)
                if not _wait_for(cons, n + 1, deadline, h.errors):
                    return False
                if n > n0 and cons.events[-1].t - cons.events[-2].t > _QUEUED_GAP_S:
                    break
    # one round of the workers: each took new indices as the queue drained, so their next batches are the
    # steady state's (a further 0.1 s here cost 0.7 s of each slow-start search and changed no reading)
    if not _wait_for(cons, len(cons.events) + max(1, h.eff.num_workers), deadline, h.errors):
        return False
    # a ranked sweep: every rank's loader drained too, so that no rank's queued batches land in the window
    cons.asked = None  # asked anew: since this opening
    while not cons.others_ready():
        if _failure(cons, h.errors) or time.perf_counter() > deadline:
            return False
        time.sleep(_POLL_S)
    return _failure(cons, h.errors) is None


class HeldLoaders:
    """Loaders kept open between their windows, one per setting (keyed by its effective knobs): the
    search's windows open them, the turns resume them, and the stall at the pick runs on its loader."""

    def __init__(self, factory: LoaderFactory, *, name: str, backend: str, batch_size: int | None, cuda: bool):
        self.factory = factory
        self.name = name
        self.backend = backend
        self.batch_size = batch_size
        self.cuda = cuda
        self.open: dict[LoaderKnobs, _Held] = {}  # by effective knobs

    def key(self, knobs: LoaderKnobs) -> LoaderKnobs:
        """The effective knobs of ``knobs`` (what the loader runs), by which its open loader is kept."""
        eff, _, _ = normalize_knobs(knobs, self.backend, cuda=self.cuda)
        return eff

    def window(
        self,
        knobs: LoaderKnobs,
        cfg: LoaderSweepConfig,
        *,
        phase: str,
        turn: int | None = None,
        floor: float | None = None,
    ) -> PointDraft:
        """One window of ``knobs``: its loader opened (and warmed up) on the first, resumed after, and kept
        open, suspended, after it; a loader that failed is closed. ``floor``: as a point's
        (:func:`stagebench.loader._point.measure_loader_point`'s ``cannot_matter_below``). A window in a
        round (``turn`` given) closes at its shortest (the module's step 3)."""
        eff, shown, notes = normalize_knobs(knobs, self.backend, cuda=self.cuda)  # the key of its open loader
        row = PointDraft.start(self.name, self.backend, eff, shown, phase, notes)
        if turn is not None:
            row.turn = turn
        t_begin = time.perf_counter()
        deadline = t_begin + cfg.timeout_s
        plan = _Plan(stall=False, throughput=True, batch_size=self.batch_size, floor=floor, shortest=turn is not None)
        h = self.open.get(eff)
        self._others_idle(eff, cfg.budget_s)
        with _quiet_sigchld():
            try:
                if h is None:
                    h = self.open[eff] = self._start(eff, shown, notes, cfg.warmup_s)
                    outcome, hung = _supervise(h.cons, eff, cfg, deadline, row, h.errors, plan)
                else:
                    row.startup_s = 0.0
                    if _resume(h, cfg, self.backend, deadline):
                        row.warmup_s = time.perf_counter() - t_begin
                        outcome, hung = timed_window(h.cons, eff, cfg, deadline, row, h.errors, plan)
                    else:
                        outcome, hung = None, self._resume_failed(h, row)
            except KeyboardInterrupt:
                self.close(hung=True)
                raise
            h.cons.gate.clear()
            self._finish(h, eff, row, outcome, hung, cfg)
        row.elapsed_s = time.perf_counter() - t_begin
        return row

    def stall(
        self, knobs: LoaderKnobs, cfg: LoaderSweepConfig, *, phase: str, during: Callable[[Any], None] | None
    ) -> PointDraft | None:
        """The epoch stall on ``knobs``'s open loader, which then closes (``during``: called with the consumer
        once the stall is read, on the workers the last epoch started afresh:
        :func:`stagebench.loader._point._measure_stall`); None where no loader of ``knobs`` is open (a fresh
        point measures it)."""
        key = self.key(knobs)
        h = self.open.pop(key, None)
        if h is None:
            return None
        eff = h.eff
        row = PointDraft.start(self.name, self.backend, eff, h.shown, phase, h.notes)
        t_begin = time.perf_counter()
        self._others_idle(key, cfg.budget_s)
        deadline = t_begin + cfg.timeout_s
        hung = False
        with _quiet_sigchld():
            try:
                row.startup_s = 0.0
                if _resume(h, cfg, self.backend, deadline):
                    row.warmup_s = time.perf_counter() - t_begin
                    hung = _measure_stall(h.cons, eff, cfg, deadline, row, h.errors, time.perf_counter(), during)
                else:
                    hung = self._resume_failed(h, row)
            finally:
                self._close_one(h, row, hung)
        if row.status == "ok":  # a fault during the epochs run to their end (the consumer's, or SPDL's)
            _failed(h.cons, h.errors, row)
        _fill(row, h.cons, None, eff, self.batch_size, cfg)
        row.time_to_first_batch_s = math.nan  # the loader opened for an earlier window
        row.elapsed_s = time.perf_counter() - t_begin
        return row

    def _others_idle(self, key: LoaderKnobs, limit_s: float) -> None:
        """Wait until the workers of the other open loaders idle (:func:`_until_idle`)."""
        waiting = [h.cons for k, h in self.open.items() if k != key]
        pids = [pid for c in waiting for pid in c.worker_pids()]
        for c in waiting:  # a ranked sweep: every rank's suspended loaders too
            pids += c.others_pids
        _until_idle(pids, limit_s)

    def keep(self, keys: set[LoaderKnobs], *, hung: bool = False) -> None:
        """Close every open loader but those of ``keys`` (``hung``: without waiting for them, as on Ctrl-C)."""
        for key in [k for k in self.open if k not in keys]:
            h = self.open.pop(key)
            self._close_one(h, None, hung)

    def close(self, *, hung: bool = False) -> None:
        """Tear down every loader kept open (never raises)."""
        self.keep(set(), hung=hung)

    def _start(self, eff: LoaderKnobs, shown: Mapping[str, bool | str], notes: list[str], warmup_s: float) -> _Held:
        cons = _Consumer(self.factory, eff, warmup_s)
        errors = _SpdlErrors()
        errors.attach()
        cons.start()
        return _Held(eff, shown, notes, cons, errors)

    @staticmethod
    def _resume_failed(h: _Held, row: PointDraft) -> bool:
        """Say in ``row`` why a resumed loader delivered nothing; returns whether it hung."""
        fail = _failure(h.cons, h.errors, check_workers=True)
        row.fail(*(fail or ("timeout", "the loader stalled after its turn resumed")))
        return fail is None

    def _finish(
        self,
        h: _Held,
        key: LoaderKnobs,
        row: PointDraft,
        outcome: Window | None,
        hung: bool,
        cfg: LoaderSweepConfig,
    ) -> None:
        if row.status == "ok" and h.errors.records:
            _failed(h.cons, h.errors, row)
        _fill(row, h.cons, outcome, h.eff, self.batch_size, cfg)
        if h.windows:  # not the first: no start-up in this window, whatever the events before it
            row.time_to_first_batch_s = math.nan
        h.windows += 1
        if row.status != "ok":  # a broken loader is not resumed: its windows end here
            self.open.pop(key, None)
            self._close_one(h, row, hung)

    @staticmethod
    def _close_one(h: _Held, row: PointDraft | None, hung: bool) -> None:
        """Tear ``h`` down (never raises); its notes and time go to ``row`` where given."""
        t_down = time.perf_counter()
        try:
            notes = _teardown(h.cons, hung=hung)
        except Exception as e:  # a teardown's fault loses no measurement
            notes = [f"teardown: {type(e).__name__}: {e}"]
        finally:
            h.errors.detach()
        if row is not None:
            row.teardown_s = time.perf_counter() - t_down
            for note in notes:
                row.note(note)


def run_turns(
    held: HeldLoaders,
    next_settings: Callable[[], list[LoaderKnobs]],
    record: Callable[[PointDraft], Any],
    *,
    cfg: LoaderSweepConfig,
    max_rounds: int,
    first_turn: int = 1,
) -> None:
    """Rounds in turns while ``next_settings()`` (asked before each round, from the rows so far) names
    settings to compare, at most ``max_rounds``, numbered from ``first_turn``, on ``held``'s loaders
    (those the search left open are resumed; the caller closes them); each window's row goes to
    ``record`` as it lands."""
    for turn, todo in in_turns(lambda _: next_settings(), max_rounds, start=first_turn):
        for knobs in todo:
            record(held.window(knobs, cfg, phase="paired", turn=turn))
