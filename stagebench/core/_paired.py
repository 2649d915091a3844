"""Threads against processes in turns: the head-to-head behind a process recommendation.

A stage's thread curve is measured seconds before its process curve, and the host's phases between
them can put either executor ahead beyond both intervals (docs/method.md#rounds-in-turns). So when the
curves alone would recommend processes by less than :data:`MAX_RATIO` (1.5x), the sweep measures both
executors again at their best levels (:func:`plan`), T P P T per round, and the recommendation follows
that paired result (:func:`paired_result`): processes only when they beat threads in it beyond noise,
else threads. The ratio is averaged over the adjacent thread/process pairs with a Student-t interval.

Why only to confirm processes: threads are preferred whenever the two are within noise (less memory, no
IPC, no pickling), so the costlier executor is the claim that needs the stronger evidence. Why 1.5x: two
points measured apart can differ by up to about 1.4x on the host's phases alone (:data:`HOST_PHASES`);
beyond 1.5x the unpaired curves decide. The rows have role ``paired`` (``results.csv``) and the analysis
reads them like any other row, so ``stagebench report`` rebuilds the same recommendation.
"""

from __future__ import annotations

from stagebench._numbers import num
from stagebench.core._curves import Point, StageRows
from stagebench.core._stage_draft import StageDraft
from stagebench.model._evidence import Ratio
from stagebench.model._stage import HeadToHead, StageSetting, keyed

__all__ = ["MAX_RATIO", "HOST_PHASES", "WITHIN_BEST", "within_noise", "plan", "paired_result", "threads_led_every_pair"]

MAX_RATIO = 1.5  # processes ahead by at least this on the curves: no head-to-head needed
#: How far apart two points measured seconds apart can read on this host's phases alone (module docstring):
#: the ratio a head-to-head could find lies within the curves' ratio over and times this.
HOST_PHASES = 1.4
WITHIN_BEST = 0.95  # within 5% of the best counts as equal (the recommendation's rule)
_MIN_PAIRS = 2  # fewer usable pairs than this: the head-to-head says nothing


def within_noise(p: Point, top: Point) -> bool:
    """``p`` is as good as ``top``: their intervals overlap, or ``p`` is within 5% of it."""
    return p.overlaps(top) or p.qps >= WITHIN_BEST * top.qps


def plan(sr: StageRows, harness: str) -> tuple[int, int] | None:
    """(thread level, process level) to measure in turns, or None when the curves decide alone.

    A head-to-head is planned when the process curve's best beats the thread
    curve's best beyond noise, by less than :data:`MAX_RATIO`.
    """
    t = sr.curve(harness, "thread").best()
    p = sr.curve(harness, "process").best()
    if t is None or p is None or p.qps <= t.qps or within_noise(t, p) or p.qps >= MAX_RATIO * t.qps:
        return None
    return t.concurrency, p.concurrency


def threads_led_every_pair(rows: list[StageDraft]) -> bool:
    """Whether threads were ahead in every pair of these head-to-head windows (T P, P T, ...), all measured.

    Then one more round (two pairs) cannot make processes win: with two or more
    pairs at a ratio under 1 and two more at any values, the 95% interval's low
    end stays under 1 (checked numerically: at most 0.99 with two known pairs,
    0.91 with four), so the head-to-head ends a round early with the same result.
    """
    if len(rows) < 4 or len(rows) % 2:
        return False
    for a, b in zip(rows[0::2], rows[1::2]):
        by_ex = {r.executor: r for r in (a, b)}
        if set(by_ex) != {"thread", "process"} or any(r.status != "ok" for r in (a, b)):
            return False
        if not by_ex["process"].qps < by_ex["thread"].qps:
            return False
    return True


def paired_result(sr: StageRows, harness: str) -> HeadToHead | None:
    """The head-to-head of ``harness`` from the stage's ``paired`` rows, or None when there is none.

    Rows are read in the order they were measured; windows two by two form
    the pairs (T P, then P T). A pair with a window that did not measure is
    left out.

    Args:
        sr: one stage's rows.
        harness: the harness whose ``paired`` rows are read.

    Returns:
        A :class:`~stagebench.model._stage.HeadToHead`: ``thread`` and ``process`` (level and mean
        throughput over the usable pairs), ``ratio`` (process / thread, geometric mean over pairs),
        ``ratio_low``/``ratio_high`` (95% Student-t on the log of the ratios; None below two pairs),
        ``pairs``, ``windows``, ``processes_win`` (beyond noise: the interval's low end above 1 and the
        ratio above 1 / 0.95) and ``decisive`` (enough pairs to count); None where no paired row is.
    """
    rows = sr.paired_rows(harness)
    if not len(rows):
        return None
    pairs, levels = [], {}
    recs = rows.to_dict("records")
    for a, b in zip(recs[0::2], recs[1::2]):
        by_ex = {r["executor"]: r for r in (a, b)}
        if set(by_ex) != {"thread", "process"}:
            continue
        qt, qp = num(by_ex["thread"]["qps"]), num(by_ex["process"]["qps"])
        ok = all(by_ex[e]["status"] == "ok" for e in by_ex)
        if ok and qt > 0 and qp > 0:
            pairs.append((qt, qp))
            levels = {e: int(num(by_ex[e]["concurrency"])) for e in by_ex}
    decisive = len(pairs) >= _MIN_PAIRS
    # on the log of the ratios, at 95% (docs/method.md#rounds-in-turns)
    r = Ratio.of_pairs([(qp, qt) for qt, qp in pairs], confidence=0.95, min_rounds=_MIN_PAIRS)
    thread, process = (
        (None, None)
        if r is None
        else (  # each executor's level and its mean throughput over the pairs
            keyed(StageSetting, concurrency=levels[ex], qps=sum(q[i] for q in pairs) / len(pairs))
            for i, ex in enumerate(("thread", "process"))
        )
    )
    return keyed(
        HeadToHead,
        pairs=len(pairs),
        decisive=decisive,
        harness=harness,
        windows=len(recs),
        thread=thread,
        process=process,
        ratio=None if r is None else r.value,
        ratio_low=None if r is None else r.low,
        ratio_high=None if r is None else r.high,
        processes_win=bool(
            r is not None and decisive and r.low is not None and r.low > 1.0 and r.value * WITHIN_BEST > 1.0
        ),
    )
