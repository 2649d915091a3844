"""Whole-pipeline runs: the replay, the validation run and the user's own settings, taking turns.

Each runs the user's pipeline over the cached source items and counts what
reaches the sink: the validation run with the real stages at the recommended
settings (the truth), the replay with stand-ins at the same settings (the
prediction, :mod:`stagebench.pipeline._replay`), and the real stages at the
user's own settings (what the recommendation is checked against).

They are compared, so they take turns (docs/method.md#rounds-in-turns): each pipeline is built and
warmed up once, and then their sources are opened in turn, in slices, in the order R V V R (three:
R V Y Y V R). Once forth and back, not twice: each switch costs a settle (below) that counts nothing;
each slice is cut into three sub-windows for the interval's batches instead. While one runs, the other's
source is closed and its stages idle. After each switch, ``settle`` seconds pass before counting starts:
the other pipeline drains and this one refills (twice the slowest pipeline's steady-state latency,
source to sink, as it runs alone, the same for every switch, at least 0.1 s, at most 1 s:
:func:`_take_turns`). All warm up at the same time, before the first slice: warming up is not measured.

One run alone (the validation run without a replay) counts one contiguous window.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from stagebench._memory import describe
from stagebench.core._mirror import Mirror, MirroredGate, Ready, mirror
from stagebench.core._rounds import in_turns
from stagebench.core._spdl_harness import quiet_spdl_log
from stagebench.model._pipeline import WholeRun
from stagebench.model._ranks import HostRate
from stagebench.model._rate import Rate
from stagebench.model._stage import changed, keyed
from stagebench.pipeline._isolate import build_validation_config, default_threads, real_pipeline
from stagebench.pipeline._replay import StandIn

__all__ = ["run_pipelines", "sink_rate", "SinkRate", "WholePipelineRun", "WHOLE", "SLICES"]

#: What the other ranks of a ranked diagnosis open for a whole-pipeline run: their own pipeline at the
#: leader's settings (:class:`stagebench.pipeline._follow.WholeRun`).
WHOLE = "pipeline"

SLICES = 2  # counting windows per pipeline when two or three take turns (once forth and back)
_SUB_WINDOWS = 3  # per slice, for the interval's batch means
_MIN_SETTLE_S, _MAX_SETTLE_S = 0.1, 1.0
#: steady-state latencies per settle (module docstring): the one closed drains its items in flight within
#: about one, the one opened reaches its pace within about one of its unloaded latency, shorter
_SETTLE_LATENCIES = 2
_ARRIVALS_PER_SLICE = 2  # a window is lengthened until each slice can see this many sink items
_MAX_WINDOW_S = 30.0  # ... but not beyond this (a pipeline slower than that is reported as it is)
# ... and, up to 10 s, until each slice can see 20: each slice's count is uncertain by one arrival at
# its edges (sink_rate), so 20 keep that under 5%: a pipeline ending in batches sees few sink items.
_PRECISE_ARRIVALS, _PRECISE_WINDOW_S = 20, 10.0


class WholePipelineRun:
    """One pipeline with a source that can be paused, and a thread that drains its sink."""

    def __init__(
        self,
        name: str,
        plan: Any,
        source_items: list,
        choices: dict[str, tuple[str, int]],
        stand_ins: dict[str, StandIn] | None,
        items_per_sink_item: float = 1.0,
    ) -> None:
        self.name = name
        self.items_per_sink_item = items_per_sink_item  # source items per sink item (an aggregate's batch)
        # the gate: the source draws (set) or waits (clear); a ranked diagnosis tells the other ranks' copies
        self.gate, self.stop = MirroredGate(), threading.Event()
        self.asked: Ready | None = None  # a ranked diagnosis: whether the other ranks' copies are warm
        self.pulls: list[float] = []
        self.arrivals: list[float] = []
        self.windows: list[tuple[float, float]] = []
        self.error: str | None = None
        self.warmup_s: float | None = None
        self.latency_s: float | None = None  # the first item's, from opening the source: pools start on it
        self.steady_latency_s: float | None = None  # once warm (:meth:`_steady_latency`)
        self._t_open, self._n0 = 0.0, 0
        self.settle_s: float | None = None  # when it took turns with another run: its longest settle
        self.extra_rounds = 0  # rounds in turns beyond forth and back, where a comparison asked for them
        self.first_round_windows: int | None = None  # windows counted in that first round, every run in it
        self.partners: list[str] = []
        # stage call timings: the real stages' (compared with the stage alone) and the stand-ins'
        # (compared with the real stages in the validation run)
        self.timings: dict[str, list] = {}
        cfg, self.closers, self.used = build_validation_config(
            plan, choices, self._source(source_items), self.timings, stand_ins=stand_ins
        )
        self.pipeline = real_pipeline(cfg, default_threads(plan))
        self._consumer = threading.Thread(target=self._consume, name=f"stagebench-{name}-sink", daemon=True)

    def _source(self, items: list):
        n, i = len(items), 0
        while True:
            self.gate.wait()  # closed: SPDL's source thread waits here and the stages go idle
            if self.stop.is_set():
                return
            self.pulls.append(time.perf_counter())
            yield items[i % n]
            i += 1

    def _consume(self) -> None:
        try:
            while not self.stop.is_set():
                try:
                    self.pipeline.get_item(timeout=0.1)
                except TimeoutError:
                    continue
                except EOFError:
                    if not self.stop.is_set():
                        self.error = self.error or "the pipeline ended (every item failed in some stage?)"
                    return
                self.arrivals.append(time.perf_counter())
        except Exception as e:  # the pipeline's own failure: the result's error
            if not self.stop.is_set():
                self.error = self.error or describe(e)

    def start(self) -> None:
        self.pipeline.start()
        self._consumer.start()

    def open_for_warm_up(self) -> None:
        self._t_open, self._n0 = time.perf_counter(), len(self.arrivals)
        self.gate.set()

    def warm(self, warmup_s: float, timeout_s: float) -> bool:
        """Whether the warm-up opened by :meth:`open_for_warm_up` is over (warm, or failed: ``error``)."""
        if self.error is not None:
            return True
        now = time.perf_counter()
        first = self.arrivals[self._n0] if len(self.arrivals) > self._n0 else None
        # warm: the minimum warm-up has passed *and* items have been reaching
        # the sink for a while (pools start lazily, on their first item)
        if first is not None and now - self._t_open >= warmup_s and now - first >= min(0.5, warmup_s):
            self.warmup_s, self.latency_s = now - self._t_open, first - self._t_open
            self.steady_latency_s = self._steady_latency(first + (now - first) / 2, now)
            return True
        if now > self._t_open + warmup_s + timeout_s:
            self.error = f"no item reached the sink within {timeout_s:g} s of warm-up"
            return True
        return False

    def sink_interval(self) -> float | None:
        """Seconds between sink items during the warm-up (from its first arrival): how long a batch takes."""
        n = len(self.arrivals) - self._n0
        if self.warmup_s is None or n < 1:
            return None
        first = self.arrivals[self._n0]
        if n == 1:
            return self._t_open + self.warmup_s - first or None
        return (self.arrivals[-1] - first) / (n - 1)

    def _steady_latency(self, t0: float, t1: float) -> float | None:
        """Seconds an item spends between the source and the sink in [t0, t1], by Little's law.

        The items in flight (drawn from the source, not yet at the sink: in
        stages and in the queues between them) over the rate through. This is
        how long the pipeline takes to drain once its source closes, and to
        refill once it opens; the first item's latency is not, as it includes
        starting the pools.
        """
        pulls, arr = np.asarray(list(self.pulls)), np.asarray(list(self.arrivals))
        through = int(np.searchsorted(arr, t1) - np.searchsorted(arr, t0)) * self.items_per_sink_item
        if through <= 0 or t1 <= t0:
            return None
        ts = np.linspace(t0, t1, 64)
        in_flight = np.searchsorted(pulls, ts, "right") - self.items_per_sink_item * np.searchsorted(arr, ts, "right")
        return float(max(0.0, in_flight.mean()) / (through / (t1 - t0)))

    def counted_latencies(self) -> list[float | None]:
        """:meth:`_steady_latency` in each counted window: the run alone (``latency_s`` is read warming up
        side by side with the others)."""
        return [self._steady_latency(t0, t1) for t0, t1 in self.windows]

    def close(self) -> None:
        self.stop.set()
        self.gate.cid = None  # closing: the other ranks' copies close with the run, not open for it
        self.gate.set()
        try:
            self.pipeline.stop(timeout=10)
        except Exception:
            pass
        self._consumer.join(timeout=2.0)
        for close in self.closers:
            try:
                close()
            except Exception:
                pass

    def window_rates(self) -> list[float]:
        """Source items per second in each counted window, in the order counted: what the comparison in
        turns pairs up (the i-th window of one run with the i-th of another)."""
        arr = np.asarray(self.arrivals, dtype=float)
        out = []
        for t0, t1 in self.windows:
            n = int(np.count_nonzero((arr >= t0) & (arr < t1)))
            out.append(n * self.items_per_sink_item / (t1 - t0) if t1 > t0 else 0.0)
        return out

    def result(self, items_per_sink_item: float) -> WholeRun:
        if self.error is not None or not self.windows:
            return keyed(WholeRun, qps=None, error=self.error or "no steady state", settings=self.used)
        seconds = sum(t1 - t0 for t0, t1 in self.windows)
        if not any(t0 <= a < t1 for a in self.arrivals for t0, t1 in self.windows):
            drawn = sum(1 for p in self.pulls for t0, t1 in self.windows if t0 <= p < t1)
            if drawn:  # working, but slower than the window: no number, and not a pipeline that delivers nothing
                return keyed(
                    WholeRun,
                    qps=None,
                    error=f"no item reached the sink in the {seconds:.1f} s counted, while {drawn} items were "
                    "drawn from the source: a sink item takes longer than that (lengthen STAGEBENCH_VALIDATION_S)",
                    settings=self.used,
                    sink_items=0,
                    seconds=seconds,
                    source_items=drawn,
                )
        sink = sink_rate(self.arrivals, self.windows)
        src = sum(1 for p in self.pulls for t0, t1 in self.windows if t0 <= p < t1)
        k = items_per_sink_item
        rate = sink.rate.scaled(k)
        return keyed(
            WholeRun,
            qps=rate.value,
            qps_low=rate.low,
            qps_high=rate.high,
            window_rates=tuple(self.window_rates()),
            seconds=seconds,
            sink_qps=sink.rate.value,
            sink_items=sink.count,
            items_per_sink_item=k,
            source_qps=src / seconds,
            warmup_s=self.warmup_s,
            settings=self.used,
            windows=len(self.windows),
            latency_s=self.steady_latency_s,
            counted_latency_s=tuple(self.counted_latencies()),
            stage_latency=_latencies_in_windows(self.timings, self.windows),
        )


@dataclass(frozen=True, slots=True)
class SinkRate:
    """Items reaching a whole pipeline's sink over its counting windows: the rate, and how many.

    The count beside the rate because a rate alone cannot tell a window that saw three items from
    one that saw three thousand; ``run.json`` keeps both (``sink_qps``, ``sink_items``).
    """

    rate: Rate
    """Arrivals per second, with the interval :func:`sink_rate` gives it."""
    count: int
    """Arrivals inside the windows."""


def sink_rate(arrivals: list[float], windows: list[tuple[float, float]]) -> SinkRate:
    """Arrivals per second over the windows, with its interval, and their count.

    The interval is from batch means: three sub-windows of each window (ten of one window alone),
    each seeing at least two arrivals. It is never narrower than the counting's own resolution:
    each window's count can be off by one arrival at its edges, so the rate by (windows / seconds)
    either way: without that floor, sub-windows that each happen to count the same number of batches
    read as no spread at all.
    """
    arr = np.asarray(arrivals, dtype=float)
    seconds = sum(t1 - t0 for t0, t1 in windows)
    count, rates = 0, []
    most = 10 if len(windows) == 1 else _SUB_WINDOWS
    for t0, t1 in windows:  # batch means: sub-windows of each window (slice)
        inside = arr[(arr >= t0) & (arr < t1)]
        count += len(inside)
        nb = int(max(1, min(most, len(inside) // 2)))  # every batch sees at least two arrivals
        counts, _ = np.histogram(inside, bins=np.linspace(t0, t1, nb + 1))
        rates.extend((counts / ((t1 - t0) / nb)).tolist())
    rate = count / seconds
    r = Rate.around(rate, rates)
    edge = len(windows) / seconds
    lo = r.low if r.low is not None else rate
    hi = r.high if r.high is not None else rate
    # never narrower than the counting's resolution: an arrival either way at each window's edges; where
    # that would reach zero or below, its share of the rate on the log scale (a rate stays positive)
    low_edge = rate - edge if rate > edge else (rate / (1 + edge / rate) if rate > 0 else 0.0)
    return SinkRate(Rate(rate, min(lo, low_edge), max(hi, rate + edge)), count)


def _latencies_in_windows(timings: dict[str, list], windows: list[tuple[float, float]]) -> dict[str, dict[str, float]]:
    """Per timed stage: median call duration (ms) and calls completed in the windows."""
    out = {}
    for name, spans in timings.items():
        d = sorted(e - s for s, e in list(spans) if any(t0 <= e < t1 for t0, t1 in windows))
        if d:
            out[name] = {"p50_ms": d[len(d) // 2] * 1e3, "calls": len(d)}
    return out


def run_pipelines(
    plan: Any,
    source_items: list,
    choices: dict[str, tuple[str, int]],
    runs: dict[str, dict[str, StandIn] | None],
    *,
    warmup_s: float,
    window_s: float,
    timeout_s: float,
    items_per_sink_item: float = 1.0,
    own_choices: dict[str, dict[str, tuple[str, int]]] | None = None,
    more: Callable[[dict[str, list[float]]], bool] | None = None,
    max_extra_rounds: int = 0,
    precise: bool = True,
) -> dict[str, WholeRun]:
    """Run the pipeline once per entry of ``runs`` (name -> stand-ins, or None for the real stages).

    Every run uses ``choices`` (stage name -> (executor, concurrency); stages not in
    it keep the user's settings) unless ``own_choices`` gives it its own (``{}``: the
    user's settings throughout). Each counts ``window_s`` seconds of steady state
    after ``warmup_s`` of warm-up. Two or three runs take turns in slices (module
    docstring); one runs alone. Returns name -> result: ``qps`` in source items per second (sink
    arrivals times ``items_per_sink_item``, the batch size after an
    aggregate), ``qps_low``/``qps_high`` (batch means over three sub-windows of each slice, or over
    ten sub-windows of one window), ``sink_qps``, ``source_qps`` (items drawn
    from the source in the windows: a cross-check), ``warmup_s``,
    ``settings``, ``windows``, ``wall_s`` (the whole call's) and
    ``stage_latency`` (median call duration inside the pipeline per thread /
    async stage, real or stand-in), ``window_rates`` (each counted slice's rate), ``first_round_windows`` (how many of
    them the first round counted, where runs took turns). A
    run that fails has ``qps`` None and its ``error``; the other goes on
    alone. ``more``: asked with every run's window rates after the turns, whether the
    comparison they serve is settled (False) or needs more rounds (True): then the real runs
    (all but the replay) take up to ``max_extra_rounds`` more rounds in turns, one slice each.
    ``precise=False``: a slow sink's slices grow only until each can hold a few sink items, not the 20 that
    keep a slice's count within 5% (:data:`_PRECISE_ARRIVALS`): for a comparison that acts only on a
    difference beyond its wider interval (the joint's replays), at half the time or less.
    """
    if not 1 <= len(runs) <= 3:
        raise ValueError(f"one to three runs take turns, got {len(runs)}")
    made: list[WholePipelineRun] = []
    t_begin = time.perf_counter()
    ranked = mirror()  # a ranked diagnosis: every other rank runs each of these pipelines at the same time
    others: dict[str, list[WholeRun]] = {}
    with quiet_spdl_log():  # items that fail are the stage's business, measured per point
        try:
            for name, stand_ins in runs.items():
                mine = (own_choices or {}).get(name, choices)
                made.append(WholePipelineRun(name, plan, source_items, mine, stand_ins, items_per_sink_item))
                if ranked is not None:
                    _open_ranked(ranked, made[-1], mine, stand_ins, items_per_sink_item, warmup_s, timeout_s)
            for r in made:
                r.start()
            _warm_up(made, warmup_s, timeout_s, ranked)
            live = [r for r in made if r.error is None]
            # A slow pipeline of large batches (50 items/s in batches of 32: a batch every 0.6 s) would
            # show no sink item in a short slice: the window grows until every slice can hold a few.
            gaps = [g for g in (r.sink_interval() for r in live) if g]
            slices = SLICES if len(live) > 1 else 1
            if gaps:
                gap = max(gaps)
                # the runs warmed up side by side, each with about 1/n of the machine: alone, a
                # sink item comes about n times as often
                window_s = max(
                    window_s,
                    min(_MAX_WINDOW_S, gap * _ARRIVALS_PER_SLICE * slices),
                    min(_PRECISE_WINDOW_S, gap / len(live) * _PRECISE_ARRIVALS * slices) if precise else 0.0,
                )
            if len(live) == 1:
                _count(live[0], window_s)
            elif live:
                real: list[WholePipelineRun] = []  # the real runs (not the replay) through the first round

                def turn(i: int) -> list[WholePipelineRun]:  # every run, then the real ones while ``more`` asks
                    if i == 0:
                        return live
                    if i == 1:
                        real.extend(r for r in live if runs.get(r.name) is None and r.error is None)
                    asked = more is not None and len(real) > 1 and more({r.name: r.window_rates() for r in made})
                    return real if asked else []

                for extra, order in in_turns(turn, 1 + max_extra_rounds, there_and_back=1):
                    _take_turns(order, window_s)
                    for r in made:
                        r.extra_rounds = extra
                        if extra == 0:  # the round every run took part in: the replay's only one
                            r.first_round_windows = len(r.windows)
            others = {r.name: _others(ranked, r, items_per_sink_item) for r in made}
        finally:
            for r in made:
                r.close()
                if ranked is not None and r.gate.cid is not None:
                    ranked.close(r.gate.cid)
    out = {}
    wall = time.perf_counter() - t_begin
    for r in made:
        res = r.result(items_per_sink_item)
        if ranked is not None:
            res = host_result(res, others.get(r.name) or [])
        res = changed(res, wall_s=wall)  # of the whole call, shared when two took turns
        if r.partners and res.qps is not None:
            partners = r.partners[0] if len(r.partners) == 1 else r.partners
            res = changed(
                res,
                settle_s=r.settle_s,
                extra_rounds=r.extra_rounds,
                first_round_windows=r.first_round_windows,
                interleaved_with=partners,
            )
        out[r.name] = res
    return out


def _warm_up(runs: list[WholePipelineRun], warmup_s: float, timeout_s: float, ranked: Mirror | None = None) -> None:
    """Warm the runs up together: their sources open at once, each closes when it is warm (in a ranked
    diagnosis: once every rank's copy is warm too, or failed).

    Together, not one after the other: warming up is not measured, and pools
    that start lazily (worker processes) start side by side. Two
    runs are left closed, to take turns; one run alone is left open.
    """
    for r in runs:
        r.open_for_warm_up()
    pending = list(runs)
    while pending:
        for r in [r for r in pending if r.warm(warmup_s, timeout_s) and _others_warm(ranked, r)]:
            pending.remove(r)
            if len(runs) > 1 or r.error is not None:
                r.gate.clear()
        if pending:
            time.sleep(0.01)


def _open_ranked(
    ranked: Mirror,
    r: WholePipelineRun,
    choices: dict[str, tuple[str, int]],
    stand_ins: dict[str, StandIn] | None,
    items_per_sink_item: float,
    warmup_s: float,
    timeout_s: float,
) -> None:
    """Every other rank opens its own copy of ``r`` (the replay with the same stand-ins)."""
    r.gate.mirror = ranked
    r.gate.cid = ranked.open(
        WHOLE,
        name=r.name,
        choices={k: list(v) for k, v in choices.items()},
        stand_ins=None if stand_ins is None else {k: s.as_dict() for k, s in stand_ins.items()},
        items_per_sink_item=items_per_sink_item,
        warmup_s=warmup_s,
        timeout_s=timeout_s,
    )


def _others_warm(ranked: Mirror | None, r: WholePipelineRun) -> bool:
    """Whether every other rank's copy of ``r`` is warm (asked once, then polled); one that failed says so
    in ``r``'s error."""
    if ranked is None or r.gate.cid is None or r.error is not None:
        return True
    if r.asked is None:
        r.asked = ranked.ready(r.gate.cid)
    if not r.asked.done():
        return False
    failed = r.asked.failure
    if failed is not None:
        r.error = failed[1]
    return True


def _others(ranked: Mirror | None, r: WholePipelineRun, k: float) -> list[WholeRun]:
    """Each other rank's rate over ``r``'s counted windows (none counted: nothing to read); a rank whose
    copy failed leaves ``r`` failed, with its reason."""
    if ranked is None or r.gate.cid is None or not r.windows or r.error is not None:
        return []
    how = {"windows": [list(w) for w in r.windows], "items_per_sink_item": k}
    got, failed = ranked.rates(r.gate.cid, r.windows[0][0], r.windows[-1][1], how)
    if failed is not None:
        r.error = failed[1]
        return []
    return [WholeRun.from_json(d) for d in got]


def host_result(res: WholeRun, others: list[WholeRun]) -> WholeRun:
    """A ranked whole-pipeline run's result: ``qps``, its interval and the sink's and source's rates are
    the host's (the sum over its ranks, over the same windows), the slowest and fastest rank's beside
    them; a rank that counted nothing leaves the run without a host figure, and says so."""

    def rate(x: WholeRun) -> Rate | None:
        return x.rate if x.qps is not None and x.qps > 0 else None

    qps = res.qps
    if qps is None or not others:
        return res
    rates = HostRate.of([rate(res), *(rate(x) for x in others)])
    res = changed(res, ranks=len(rates.ranks))
    host, slow, fast = rates.host, rates.slowest, rates.fastest
    if host is None or slow is None or fast is None:
        missing = [str(i) for i, x in enumerate(rates.ranks) if x is None]
        return changed(res, qps=None, error=f"local rank(s) {', '.join(missing)} counted no item at the sink")
    scale = host.value / qps
    return changed(
        res,
        qps=host.value,
        qps_low=host.low,
        qps_high=host.high,
        rank_min_qps=slow.value,
        rank_max_qps=fast.value,
        sink_qps=None if res.sink_qps is None else res.sink_qps * scale,
        source_qps=None if res.source_qps is None else res.source_qps * scale,
    )


def _take_turns(order: list[WholePipelineRun], window_s: float) -> None:
    """Count one round in turns: a slice of ``window_s / SLICES`` of each run in ``order``, settling after each switch.

    Each settle is two steady-state latencies of the slowest run (the same settle for all, so that none
    is favoured), as each runs alone: read in its counted slices once it has one, before that from its
    warm-up divided by n, where the runs warmed up side by side and Little's law reads n times the latency
    alone.
    """
    runs = list(dict.fromkeys(order))
    n = len(runs)

    def alone(r: WholePipelineRun) -> float:
        counted = [x for x in r.counted_latencies() if x is not None]
        if counted:
            return max(counted)
        warm = r.steady_latency_s if r.steady_latency_s is not None else r.latency_s
        return (warm or 0.0) / n

    prev: WholePipelineRun | None = None
    for r in order:
        if r.error is not None:
            continue
        if r is not prev:
            lat = max(alone(x) for x in runs)  # the same for every run: none is favoured by a longer settle
            settle = min(_MAX_SETTLE_S, max(_MIN_SETTLE_S, _SETTLE_LATENCIES * lat))
            if prev is not None:
                prev.gate.clear()
            r.gate.set()
            time.sleep(settle)  # the other drains, this one refills
            r.settle_s = max(r.settle_s or 0.0, settle)
        _count(r, window_s / SLICES, keep_open=True)
        prev = r
    for r in runs:
        r.gate.clear()
        r.partners = r.partners or [o.name for o in runs if o is not r]


def _count(r: WholePipelineRun, seconds: float, keep_open: bool = False) -> None:
    """Count one window of ``r``'s sink arrivals (its source open)."""
    r.gate.set()
    t0 = time.perf_counter()
    end = t0 + seconds
    while r.error is None and time.perf_counter() < end:
        time.sleep(min(0.05, max(0.0, end - time.perf_counter())))
    t1 = time.perf_counter()
    if not keep_open:
        r.gate.clear()
    if r.error is None:
        r.windows.append((t0, t1))
