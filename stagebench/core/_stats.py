"""Throughput from per-item intervals: fractional counting and batch means.

Why fractional counting: a closed loop of c workers completes items at discrete
instants. Counting completions inside a window errs by up to one item per
worker, which at low rates (a 200 ms stage over a 2 s window) is a 10% error.
Counting each item by the share of its [start, end] interval that falls inside
the window removes that quantisation: c back-to-back lanes tile the window.

Why batch means: successive items are correlated (shared caches, the GIL), so
the spread of single items says little about the spread of the mean. Splitting
the window into equal batches and treating the batch rates as roughly
independent samples gives an honest Student-t interval, provided each batch
spans several item latencies; :func:`batch_count` enforces that.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from stagebench.model._rate import Rate, t_quantile  # one copy, kept with the rate it serves

__all__ = [
    "fractional_counts",
    "batch_count",
    "MeanInterval",
    "mean_interval",
    "percentiles_ms",
    "t_quantile",
]


def fractional_counts(starts: np.ndarray, ends: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Items completed per bin, each item split over the bins its interval overlaps.

    ``starts``/``ends``: per-item times; ``edges``: bin edges (ascending, len n+1).
    Returns n fractional counts. Zero-length items count fully in the bin of their end.
    Items inside one bin (nearly all of them) are counted with a histogram; only
    those that straddle an edge need the overlap arithmetic (a no-op ceiling logs
    millions of items: an items x bins matrix would take seconds).
    """
    n_bins = len(edges) - 1
    counts = np.zeros(n_bins)
    if len(starts) == 0:
        return counts
    i_s = np.searchsorted(edges, starts, side="right") - 1
    i_e = np.searchsorted(edges, ends, side="right") - 1
    dur = ends - starts
    # an item ending exactly on the last edge belongs to the last bin
    i_e = np.where(ends == edges[-1], n_bins - 1, i_e)
    inside = (i_s == i_e) & (i_s >= 0) & (i_s < n_bins)
    zero = (dur <= 0) & (i_e >= 0) & (i_e < n_bins)
    whole = inside | zero
    counts += np.bincount(np.where(zero, i_e, i_s)[whole], minlength=n_bins)[:n_bins]
    rest = ~whole & (dur > 0)
    if rest.any():
        s, e, d = starts[rest], ends[rest], dur[rest]
        lo = np.maximum(s[:, None], edges[None, :-1])
        hi = np.minimum(e[:, None], edges[None, 1:])
        counts += (np.clip(hi - lo, 0.0, None) / d[:, None]).sum(axis=0)
    return counts


def batch_count(window_s: float, latency_s: float, max_batches: int) -> int:
    """Batches such that each spans at least two typical item latencies."""
    if latency_s <= 0:
        return max_batches
    return int(max(1, min(max_batches, math.floor(window_s / (2.0 * latency_s)))))


@dataclass(frozen=True, slots=True)
class MeanInterval:
    """A sample mean, the bounds of its Student-t interval and the samples' coefficient of variation.

    Plain floats, NaN where unknown (no samples; fewer than two for the bounds and the CV): the
    measuring loop compares them as numbers, and the rows store them so.
    """

    mean: float
    low: float
    high: float
    cv: float


def mean_interval(samples: Sequence[float], confidence: float) -> MeanInterval:
    """Mean of the batch rates ``samples``, its Student-t interval on the log scale, and their CV.

    The interval is :meth:`Rate.around`'s (a rate's errors multiply, so it never reaches below zero:
    :mod:`stagebench.model._rate`). With fewer than two samples, or a zero mean, it is unknown (NaN),
    never zero-width.
    """
    x = np.asarray(samples, dtype=float)
    if len(x) == 0:
        return MeanInterval(math.nan, math.nan, math.nan, math.nan)
    mean = float(x.mean())
    if len(x) < 2:
        return MeanInterval(mean, math.nan, math.nan, math.nan)
    sd = float(x.std(ddof=1))
    cv = sd / mean if mean > 0 else math.nan
    rate = Rate.around(max(mean, 0.0), x.tolist(), confidence)
    if rate.low is None or rate.high is None:
        return MeanInterval(mean, math.nan, math.nan, cv)
    return MeanInterval(mean, rate.low, rate.high, cv)


def percentiles_ms(durations_s: np.ndarray) -> tuple[float, float, float]:
    """p50, p90, p99 in milliseconds (NaN when no item completed)."""
    if len(durations_s) == 0:
        return (math.nan, math.nan, math.nan)
    p = np.percentile(durations_s, [50, 90, 99]) * 1e3
    return (float(p[0]), float(p[1]), float(p[2]))
