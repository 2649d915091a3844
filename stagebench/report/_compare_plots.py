"""Figures that set runs or settings side by side: runs' curves overlaid, each run's best with its
interval, and the training job at each candidate setting.

Theme, colours and the SVG text they become: :mod:`stagebench.report._plots`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from matplotlib.ticker import FuncFormatter

from stagebench._numbers import finite, num
from stagebench.model._job import JobVerdict
from stagebench.report._html import rate_text, si_label
from stagebench.report._plots import (
    INK,
    OKABE_ITO,
    SERIES_COLORS,
    SERIES_MARKERS,
    figure_axes,
    figure_to_svg,
    log2_axis,
    nw_axis,
    plot_text,
    shade_band,
    themed,
)

__all__ = ["Curve", "Bar", "compare_curves_svg", "compare_best_svg", "job_svg"]


@dataclass(frozen=True, slots=True)
class Curve:
    """One run's series on a comparison: ``y`` against ``x``, its interval (``y`` itself where none was
    measured), and the recommended point (None where the run recommends none)."""

    label: str
    x: Sequence[float]
    y: Sequence[float]
    low: Sequence[float] | None = None
    high: Sequence[float] | None = None
    rec_x: Any = None
    rec_y: Any = None


@dataclass(frozen=True, slots=True)
class Bar:
    """One run's best throughput with its interval (None where not known)."""

    label: str
    value: float | None
    low: float | None = None
    high: float | None = None


@themed
def compare_curves_svg(
    series: Sequence[Curve], *, xlabel: str, ylabel: str, log2_x: bool, title: str | None = None
) -> str | None:
    """Overlaid curves, one per run, each with its band and its recommended point as a star."""
    series = [s for s in series if len(s.x)]
    if not series:
        return None
    # the legend sits beside the axes, one line a run: the figure grows with it (about 0.2 in a
    # line) so that comparing many runs does not crush the axes to nothing
    fig, ax = figure_axes(8.4, max(3.6, 0.2 * len(series) + 0.9))
    xs_all = sorted({float(v) for s in series for v in s.x})
    pos = None
    if log2_x and all(v > 0 for v in xs_all):
        log2_axis(ax, xs_all)
    else:
        pos = nw_axis(ax, [int(v) for v in xs_all])
    for i, s in enumerate(series):
        # colour and marker together tell runs apart (and without colour): past eight runs the
        # colours repeat and the markers shift by one, so no pair repeats before 64 runs
        color = SERIES_COLORS[i % len(SERIES_COLORS)]
        marker = SERIES_MARKERS[(i + i // len(SERIES_COLORS)) % len(SERIES_MARKERS)]
        x = np.asarray(s.x, float)
        xp = x if pos is None else np.array([pos[int(v)] for v in x], float)
        y = np.asarray(s.y, float)
        lo = np.asarray(y if s.low is None else s.low, float)
        hi = np.asarray(y if s.high is None else s.high, float)
        shade_band(ax, xp, lo, hi, color, 0.15)
        ax.plot(xp, y, "-", color=color, marker=marker, markersize=5, linewidth=2, label=plot_text(s.label, 40))
        if s.rec_x is not None and s.rec_y is not None:
            rx = float(s.rec_x) if pos is None else pos.get(int(s.rec_x))
            if rx is not None:
                ax.plot(
                    [rx],
                    [s.rec_y],
                    marker="*",
                    markersize=15,
                    color=color,
                    markeredgecolor=INK,
                    linestyle="none",
                    zorder=5,
                )
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_formatter(FuncFormatter(si_label))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(plot_text(title, 60))
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, title="★ recommended")
    return figure_to_svg(fig)


@themed
def compare_best_svg(bars: Sequence[Bar], *, unit: str) -> str | None:
    """Best throughput per run with its interval, winner on top."""
    entries = [e for e in bars if e.value is not None and math.isfinite(float(e.value))]
    if not entries:
        return None
    entries = sorted(entries, key=lambda e: float(num(e.value)))
    fig, ax = figure_axes(8.4, 0.5 * len(entries) + 1.3)
    ax.grid(False, axis="y")
    ys = np.arange(len(entries))
    for y, e in enumerate(entries):  # ys[y] == y; a plain int, as Axes.text's stubs want
        v = float(num(e.value))
        xerr = [[max(0.0, v - num(e.low))], [max(0.0, num(e.high) - v)]] if finite(e.low, e.high) else None
        color = OKABE_ITO["blue"] if y == ys[-1] else OKABE_ITO["grey"]
        ax.barh(y, v, height=0.6, color=color, xerr=xerr, error_kw={"ecolor": INK, "capsize": 3})
        right = v + (xerr[1][0] if xerr else 0.0)
        ax.text(right, y, f"  {rate_text(v)}", va="center", ha="left", fontsize=8.5)
    ax.set_yticks(ys)
    ax.set_yticklabels([plot_text(e.label, 40) for e in entries])
    ax.set_xlim(0, max(float(num(e.high or e.value)) for e in entries) * 1.25)
    ax.xaxis.set_major_formatter(FuncFormatter(si_label))
    ax.set_xlabel(f"best throughput ({unit}), 95% interval")
    return figure_to_svg(fig)


@themed
def job_svg(job: JobVerdict | None) -> str | None:
    """The training job at each candidate: your loop's throughput (bars, 95% interval), the loader or
    pipeline alone at that setting (diamonds), your step alone (a dashed line); the pick in blue.

    A log axis where the loader alone runs far above the job (a slow step): linear, the job's bars
    would be slivers next to the diamonds."""
    figs = [(c, c.job) for c in (job.candidates if job is not None else ()) if c.job is not None]
    cands = [(c, f) for c, f in figs if f.samples_per_s is not None]
    if job is None or not cands:
        return None
    unit = job.unit or "samples/s"
    rates = [num(f.samples_per_s) for _, f in cands]
    highs = [num(f.samples_per_s_high) for _, f in cands]
    alones = [num(c.alone.value if c.alone is not None else None) for c, _ in cands]
    demand = num(job.demand)
    top = max(x for x in [*rates, *highs, *alones, demand] if finite(x))
    low = min(rates)
    log = top > 8 * low
    left = low / 2 if log else 0.0
    fig, ax = figure_axes(8.4, 0.55 * len(cands) + 1.5)
    ax.grid(False, axis="y")
    if log:
        ax.set_xscale("log")
    for y, (c, f) in enumerate(reversed(cands)):
        v = num(f.samples_per_s)
        lo, hi = num(f.samples_per_s_low), num(f.samples_per_s_high)
        xerr = [[max(0.0, v - lo)], [max(0.0, hi - v)]] if finite(lo, hi) and lo > left else None
        color = OKABE_ITO["blue"] if c.key == job.pick else OKABE_ITO["grey"]
        ax.barh(y, v - left, left=left, height=0.6, color=color, xerr=xerr, error_kw={"ecolor": INK, "capsize": 3})
        alone = num(c.alone.value if c.alone is not None else None)
        if finite(alone):
            ax.plot([alone], [y], marker="D", color=OKABE_ITO["orange"], markersize=6, linestyle="none")
    if finite(demand):
        ax.axvline(demand, color=OKABE_ITO["vermillion"], linestyle="--", linewidth=1.2)
    ax.set_yticks(np.arange(len(cands)))
    ax.set_yticklabels([plot_text(c.label, 44) for c, _ in reversed(cands)])
    ax.set_xlim(left, top * (1.5 if log else 1.15))
    ax.xaxis.set_major_formatter(FuncFormatter(si_label))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    ax.set_xlabel(
        f"{unit}{' (log scale)' if log else ''}: your job (bars, 95% interval) · alone (◆) · your step alone (dashed)"
    )
    return figure_to_svg(fig)
