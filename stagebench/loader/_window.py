"""A window's figures from its batches' arrivals: throughput with its interval, a rank's share, the start-up split.

A batch arrives at one instant, so throughput is samples over the span between arrivals (no counting
error of a whole batch at the window edges). In-order delivery makes arrivals come in rounds of the
workers, so the span covers whole rounds (:func:`window_rate`), and the interval comes from batch
means over consecutive groups of whole rounds.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import NamedTuple

from stagebench._numbers import num
from stagebench.loader._draft import PointDraft
from stagebench.model._ranks import HostRate, WindowShare
from stagebench.model._rate import Rate

__all__ = ["window_rate", "window_share", "share_slices", "startup_split"]


class _Event(NamedTuple):
    t: float
    epoch: int
    pid: int | None
    n: int | None
    threads: int
    worker: int = -1
    born: tuple[float | None, float | None, float | None, float] | None = None


def _rough_batch_rate(events: list[_Event]) -> float:
    tail = events[-50:]
    if len(tail) < 2 or tail[-1].t <= tail[0].t:
        return 0.0
    return (len(tail) - 1) / (tail[-1].t - tail[0].t)


def window_rate(
    events: Sequence[_Event],
    t0: float,
    t1: float,
    *,
    rnd: int,
    batch_size: int | None,
    max_groups: int,
    confidence: float,
) -> dict[str, float]:
    """Throughput and its interval from the arrivals inside [t0, t1], over whole rounds of ``rnd`` workers
    (why whole rounds: docs/method.md, "Loaders: whole rounds of arrivals").

    Returns ``n_batches``, ``n_samples``, ``samples_per_s``, ``batches_per_s`` and, with two groups or
    more, ``cv``, ``samples_per_s_low`` / ``samples_per_s_high``; an empty dict when no gap lies in the
    window.
    """
    import numpy as np  # start-up cost: numpy loads where a window is measured

    gaps: list[float] = []
    samples: list[float] = []
    k_in_epoch = 0
    prev = None
    for e in events:
        k_in_epoch = 0 if prev is None or e.epoch != prev.epoch else k_in_epoch + 1
        # After an epoch restart all workers deliver at once: skip the first round.
        if (
            prev is not None
            and prev.t >= t0
            and e.t <= t1
            and e.epoch == prev.epoch
            and (e.epoch == 0 or k_in_epoch >= rnd)
        ):
            gaps.append(e.t - prev.t)
            n_batch = e.n if e.n is not None else batch_size
            samples.append(float(n_batch) if n_batch is not None else math.nan)
        prev = e
    rounds = len(gaps) // rnd
    nb = rounds * rnd if rounds else len(gaps)  # fewer gaps than a round: all of them (min_gaps prevents it)
    g = np.asarray(gaps[:nb], dtype=float)
    s = np.asarray(samples[:nb], dtype=float)
    span = float(g.sum())
    if nb == 0 or span <= 0:
        return {}
    n = float(s.sum())
    # seconds per sample: the rate is its inverse, so the inverted bounds bracket the rate exactly
    spi = span / n if n > 0 else math.inf
    out: dict[str, float] = {
        "n_batches": nb,
        "n_samples": n,
        "samples_per_s": 1.0 / spi if n > 0 else n,
        "batches_per_s": nb / span,
    }
    # Batch means over consecutive groups of whole rounds: each group's rate, and the interval around the
    # pooled rate on the log scale (stagebench.model._rate.Rate.around: it stays positive and finite)
    k = min(max_groups, nb // max(2, rnd))
    if k >= 2 and np.isfinite(s).all():
        parts = [np.arange(r[0] * rnd, (r[-1] + 1) * rnd) for r in np.array_split(np.arange(rounds), k)]
        per = [float(s[p].sum() / g[p].sum()) for p in parts if g[p].sum() > 0 and s[p].sum() > 0]
        mean = sum(per) / len(per) if per else math.nan
        if len(per) >= 2 and mean > 0:
            out["cv"] = float(np.std(per, ddof=1)) / mean
            r = Rate.around(out["samples_per_s"], per, confidence)
            if r.low is not None and r.high is not None:
                out["samples_per_s_low"], out["samples_per_s_high"] = r.low, r.high
    return out


def share_slices(events: Sequence[_Event], t0: float, t1: float, *, rnd: int, max_groups: int) -> int:
    """How many slices a ranked window is cut into (every rank's share the same): as many as this rank's
    arrivals in it hold two rounds of its workers each, at most ``max_groups``; 1 (no interval) below two."""
    arrivals = sum(1 for e in events if t0 <= e.t <= t1)
    return max(1, min(max_groups, arrivals // (2 * max(1, rnd))))


def window_share(
    events: Sequence[_Event], t0: float, t1: float, now: float, *, rnd: int, batch_size: int | None, slices: int
) -> WindowShare:
    """This rank's share of a ranked window [t0, t1] cut into ``slices`` equal slices (the host's rate
    sums every rank's: :meth:`stagebench.model._ranks.HostRate.over_window`).

    Each arrival's batch is spread over the gap before it, so a slice holds the part of each gap that falls
    in it, and counts those seconds. The gaps :func:`window_rate` leaves out (an epoch's restart, its first
    round) count neither samples nor seconds. The gap after the last arrival, still open at ``now`` (when
    this is asked, after the window closed), counts as one batch arriving ``now``: a rank stalled at the
    window's end is counted so, not left out.
    """
    n_slices = max(1, slices)
    width = (t1 - t0) / n_slices
    samples = [0.0] * n_slices
    seconds = [0.0] * n_slices

    def spread(a: float, b: float, n: float) -> None:
        lo, hi = max(a, t0), min(b, t1)
        if hi <= lo or b <= a:
            return
        first, last = int((lo - t0) // width), min(n_slices - 1, int((hi - t0) // width))
        for i in range(max(0, first), last + 1):
            s0 = t0 + i * width
            part = max(0.0, min(hi, s0 + width) - max(lo, s0))
            samples[i] += n * part / (b - a)
            seconds[i] += part

    prev: _Event | None = None
    k_in_epoch = 0
    for e in events:
        k_in_epoch = 0 if prev is None or e.epoch != prev.epoch else k_in_epoch + 1
        if prev is not None and e.t > t0 and e.epoch == prev.epoch and (e.epoch == 0 or k_in_epoch >= rnd):
            spread(prev.t, e.t, float(e.n if e.n is not None else batch_size or 1))
        if e.t > t1:
            break
        prev = e
    else:
        if prev is not None and prev.t < t1 and now > prev.t:
            spread(prev.t, now, float(prev.n if prev.n is not None else batch_size or 1))
    return WindowShare(tuple(samples), tuple(seconds))


def startup_split(events: Sequence[_Event], t_iter: float, wall_offset: float) -> dict[str, float]:
    """Where the time to each worker's first batch went, from the stamps on the first batches
    (:class:`TimedInit`, :class:`TaggedCollate`): medians over the workers, and the last worker's start.

    ``workers_start_s``: from ``iter()`` until the worker reached its ``worker_init_fn``, in two parts:
    ``workers_created_s``, until its process was created (the main process starting the workers before
    it: under spawn or forkserver it pickles the dataset for each and hands it over, waiting, where the
    copy does not fit the pipe, until that worker has read it), and ``worker_boot_s``, from there (the
    process's own imports, and loading the dataset shipped to it); ``worker_init_s``: the user's
    ``worker_init_fn``; ``first_batch_work_s``: fetching and collating its first batch (torch sends no
    index before every worker has started: a wait for the others is in it); ``first_delivery_s``: from
    there to the batch reaching the loop. Empty without stamps (no workers).
    """
    if not math.isfinite(t_iter):
        return {}
    start = t_iter + wall_offset
    born = [(e.born, e.t + wall_offset) for e in events[:4096] if e.epoch == 0 and e.born is not None]
    if not born:
        return {}
    out = {"first_delivery_s": statistics.median(max(0.0, t - b[3]) for b, t in born)}
    if all(b[1] is not None and b[2] is not None for b, _ in born):
        starts = [num(b[1]) - start for b, _ in born]
        out.update(
            workers_start_s=statistics.median(starts),
            workers_start_last_s=max(starts),
            worker_init_s=statistics.median(num(b[2]) - num(b[1]) for b, _ in born),
            first_batch_work_s=statistics.median(b[3] - num(b[2]) for b, _ in born),
        )
    created = [(b[0], b[1], b[3]) for b, _ in born if b[0] is not None]
    if len(created) < len(born):
        return out
    # a worker's creation read to the kernel's tick: never below iter()
    out["workers_created_s"] = statistics.median(max(0.0, c - start) for c, _, _ in created)
    if "workers_start_s" in out:
        out["worker_boot_s"] = statistics.median(num(i) - max(c, start) for c, i, _ in created)
    else:  # no worker_init_fn to time by: from its creation to its first batch, whole
        out["worker_unsplit_s"] = statistics.median(d - max(c, start) for c, _, d in created)
    return out


def _host_figures(
    row: PointDraft, mine: WindowShare, others: tuple[WindowShare | None, ...], confidence: float
) -> None:
    """A ranked window's row: ``samples_per_s`` and its interval are the host's (the sum over its ranks of
    their shares of the window, :meth:`stagebench.model._ranks.HostRate.over_window`), with the slowest and
    fastest rank's beside them."""
    rates = HostRate.over_window([mine, *others], confidence)
    host = rates.host
    row.ranks = len(rates.ranks)
    if host is None or rates.slowest is None or rates.fastest is None:
        missing = [r for r, x in enumerate(rates.ranks) if x is None]
        if row.status == "ok":
            row.fail("failed", f"local rank(s) {', '.join(map(str, missing))} delivered no batch in the window")
        return
    row.batches_per_s = row.batches_per_s * host.value / row.samples_per_s  # this rank's batch size
    row.samples_per_s = host.value
    row.samples_per_s_low = math.nan if host.low is None else host.low
    row.samples_per_s_high = math.nan if host.high is None else host.high
    row.rank_min_samples_per_s = rates.slowest.value
    row.rank_max_samples_per_s = rates.fastest.value
