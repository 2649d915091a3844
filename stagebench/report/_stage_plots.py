"""The figures of a pipeline run: each stage's throughput and resources against concurrency, and
the pipeline's overview (each stage's recommended throughput against the pipeline's bounds).

Theme, colours and the SVG text they become: :mod:`stagebench.report._plots`.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.patches
import numpy as np
import pandas as pd
from matplotlib.ticker import FuncFormatter

from stagebench._numbers import SourceItems, finite, num
from stagebench.model._stage import StageEntry, StageSetting
from stagebench.model._summary import Summary
from stagebench.report._html import rate_text, si_label
from stagebench.report._plots import (
    CLASS_COLORS,
    EXECUTOR_COLORS,
    EXECUTOR_MARKERS,
    GRID,
    HARNESS_STYLES,
    INK,
    OKABE_ITO,
    as_numeric,
    figure_axes,
    figure_to_svg,
    log2_axis,
    new_figure,
    ok_rows,
    plot_text,
    recommended_star,
    shade_band,
    style_axes,
    themed,
    usl_curve,
)

__all__ = ["stage_throughput_svg", "stage_resources_svg", "pipeline_overview_svg"]


@themed
def stage_throughput_svg(rows: pd.DataFrame, stage: StageEntry | None = None) -> str | None:
    """QPS vs concurrency for one stage: every executor × harness with its interval band,
    the ideal line from concurrency 1, the harness ceiling, the fitted USL curve and the
    recommended point.

    ``rows``: this stage's rows (role ``stage`` and ``ceiling``). ``stage``: its summary entry.
    """
    rows = as_numeric(rows, ("concurrency", "qps", "qps_low", "qps_high"))
    entry = stage or StageEntry()
    st = rows[rows["role"] == "stage"]
    ok = ok_rows(st)
    if ok.empty:
        return None
    fig, ax = figure_axes(8.4, 3.9)
    levels = sorted(set(rows["concurrency"].dropna().astype(int)))
    top = float(np.nanmax(ok[["qps", "qps_high"]].to_numpy(float)))
    fits = entry.fit
    above: list[str] = []
    for (harness, ex), g in ok.groupby(["harness", "executor"], sort=True):
        color = EXECUTOR_COLORS.get(ex, OKABE_ITO["black"])
        ls = HARNESS_STYLES.get(harness, "-")
        label = f"{ex} ({harness})" if rows["harness"].nunique() > 1 else ex
        c, q = g["concurrency"].to_numpy(float), g["qps"].to_numpy(float)
        lo, hi = g["qps_low"].to_numpy(float), g["qps_high"].to_numpy(float)
        shade_band(ax, c, lo, hi, color, 0.16)
        ax.plot(
            c,
            q,
            ls,
            color=color,
            marker=EXECUTOR_MARKERS.get(ex, "o"),
            markersize=5,
            linewidth=2,
            label=f"{label}: measured",
            zorder=3,
        )
        fit = fits.get(f"{harness}/{ex}")
        if fit:
            # the fitted curve only where this series was measured: no extrapolation
            cgrid = np.geomspace(max(1.0, float(c.min())), float(c.max()), 96)
            y = usl_curve(cgrid, fit, g)
            if y is not None and np.all(np.isfinite(y)):
                ax.plot(cgrid, y, ":", color=color, linewidth=1.4, label=f"{label}: USL fit", zorder=2)
        ceil = ok_rows(rows[(rows["role"] == "ceiling") & (rows["harness"] == harness) & (rows["executor"] == ex)])
        if len(ceil):
            cq = ceil["qps"].to_numpy(float)
            if float(np.nanmax(cq)) <= 2.5 * top:
                ax.plot(
                    ceil["concurrency"],
                    cq,
                    "-.",
                    color=color,
                    alpha=0.55,
                    linewidth=1.2,
                    marker="_",
                    markersize=9,
                    label=f"{label}: harness ceiling (no-op)",
                )
                top = max(top, float(np.nanmax(cq)))
            else:
                above.append(f"{label} ceiling ≥ {rate_text(float(np.nanmin(cq)))}/s")
    # Ideal linear scaling from the best concurrency-1 point.
    one = ok[ok["concurrency"] == levels[0]]
    if len(one):
        q1 = float(one["qps"].max()) / levels[0]
        xs = np.array([levels[0], levels[-1]], dtype=float)
        ax.plot(xs, q1 * xs, "--", color=OKABE_ITO["grey"], linewidth=1, label="ideal (linear from c=1)", zorder=1)
    rec = entry.recommended or StageSetting()
    if rec.concurrency and rec.qps is not None:
        executor = rec.executor if "executor" in rec.keys else "?"
        recommended_star(ax, rec.concurrency, rec.qps, f"recommended: {executor} × {rec.concurrency}")
    bad = st[st["status"] != "ok"]
    if len(bad):
        ax.plot(
            bad["concurrency"],
            np.zeros(len(bad)),
            "x",
            color=INK,
            markersize=8,
            markeredgewidth=1.6,
            clip_on=False,
            label="not measured (see table)",
            zorder=4,
        )
    ax.set_ylim(0, top * 1.18)
    if above:
        ax.text(
            0.99,
            0.03,
            "off the chart: " + "; ".join(above),
            transform=ax.transAxes,
            ha="right",
            va="bottom",
            fontsize=8,
            color="#555555",
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1.5},
        )
    log2_axis(ax, levels)
    ax.yaxis.set_major_formatter(FuncFormatter(si_label))
    ax.set_xlabel("concurrency (workers or tasks in flight, log₂ scale)")
    ax.set_ylabel("throughput (items/s)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return figure_to_svg(fig)


@themed
def stage_resources_svg(rows: pd.DataFrame, usable_cores: float | None = None) -> str | None:
    """Cores used, latency p50/p99 and memory vs concurrency, one panel each."""
    rows = as_numeric(
        rows, ("concurrency", "cores_used", "latency_p50_ms", "latency_p99_ms", "mem_pss_mb", "mem_peak_mb", "qps")
    )
    ok = ok_rows(rows[rows["role"] == "stage"])
    if ok.empty:
        return None
    levels = sorted(set(ok["concurrency"].astype(int)))
    fig = new_figure(10.0, 2.9)
    axes = fig.subplots(1, 3)
    groups = list(ok.groupby(["harness", "executor"], sort=True))
    multi_h = ok["harness"].nunique() > 1
    for (harness, ex), g in groups:
        color = EXECUTOR_COLORS.get(ex, INK)
        ls = HARNESS_STYLES.get(harness, "-")
        mk = EXECUTOR_MARKERS.get(ex, "o")
        label = f"{ex} ({harness})" if multi_h else ex
        c = g["concurrency"].to_numpy(float)
        axes[0].plot(c, g["cores_used"], ls, color=color, marker=mk, markersize=4, label=label)
        axes[1].plot(c, g["latency_p50_ms"], ls, color=color, marker=mk, markersize=4, label=f"{label} p50")
        axes[1].plot(c, g["latency_p99_ms"], ":", color=color, marker=mk, markersize=3, alpha=0.8, label=f"{label} p99")
        mem = g["mem_pss_mb"] if g["mem_pss_mb"].notna().any() else g["mem_peak_mb"]
        axes[2].plot(c, mem, ls, color=color, marker=mk, markersize=4, label=label)
    if usable_cores:
        axes[0].axhline(usable_cores, color=OKABE_ITO["grey"], linestyle="--", linewidth=1)
        axes[0].annotate(
            f"{usable_cores:g} usable cores",
            (0.02, usable_cores),
            xycoords=("axes fraction", "data"),
            va="bottom",
            fontsize=8,
            color="#555555",
        )
        axes[0].set_ylim(0, max(float(usable_cores), float(np.nanmax(ok["cores_used"].to_numpy(float)))) * 1.2)
    else:
        axes[0].set_ylim(bottom=0)
    axes[0].set_title("cores used")
    axes[0].set_ylabel("CPU s / wall s (cores)")
    axes[1].set_title("latency per item")
    axes[1].set_ylabel("latency (ms)")
    axes[1].set_ylim(bottom=0)
    axes[2].set_title("memory (PSS, process + workers)")
    axes[2].set_ylabel("memory (MB)")
    axes[2].set_ylim(bottom=0)
    for ax in axes:
        style_axes(ax)
        log2_axis(ax, levels)
        ax.set_xlabel("concurrency (log₂)")
    axes[0].legend(loc="lower right")
    axes[1].legend(loc="upper left", fontsize=7.5, ncol=1)
    return figure_to_svg(fig)


@themed
def pipeline_overview_svg(sm: Summary, entries: Sequence[StageEntry]) -> str | None:
    """Each stage's recommended throughput (with interval) against the pipeline's bounds.

    One glance shows the bottleneck: the shortest bar, unless the cores or GIL line
    sits left of every bar. When the stages differ by more than 10x (a batching
    stage next to a decoder) the axis is logarithmic, or the slow stages vanish.
    """
    # the stages recommended at a throughput above zero
    stages = [(s, r) for s in entries if (r := s.recommended) is not None and finite(r.qps) and num(r.qps) > 0]
    if not stages:
        return None
    pred, val = sm.prediction, sm.validation
    lines = []
    bounds = pred.bounds
    for key, label, style, color in (
        ("cores", "cores bound", "--", OKABE_ITO["orange"]),
        ("gil", "GIL bound", "-.", OKABE_ITO["vermillion"]),
    ):
        v = bounds.get(key)
        if v is not None and finite(v) and float(v) > 0:
            lines.append((float(v), f"{label}: {rate_text(float(v))}/s", style, color))
    if pred.qps is not None and finite(pred.qps) and float(pred.qps) > 0:
        lines.append((float(pred.qps), f"predicted pipeline: {rate_text(float(pred.qps))}/s", "-", INK))
    if val.qps is not None and finite(val.qps) and float(val.qps) > 0:
        lines.append((float(val.qps), f"measured pipeline: {rate_text(float(val.qps))}/s", ":", OKABE_ITO["green"]))
    # One unit with the bound and pipeline lines: source items/s. A stage after a batch of 16 handles
    # 16 source items per call, so its calls/s times 16 is what it can feed the pipeline.
    units = [SourceItems(s.items_per_input) for s, _ in stages]
    vals = [num(src.rate(r.qps)) for (_, r), src in zip(stages, units)]
    lo_all = min(vals + [v for v, *_ in lines])
    log = max(vals) / lo_all > 10
    xmin, xmax = (lo_all / 2, max(vals) * 6) if log else (0.0, max(vals) * 1.3)

    fig, ax = figure_axes(8.4, 0.75 * len(stages) + 1.2)
    ax.grid(True, axis="x", color=GRID)
    ax.grid(False, axis="y")
    if log:
        ax.set_xscale("log")
    ys = np.arange(len(stages))[::-1]
    for y, (s, r), q, src in zip(ys, stages, vals, units):
        color = CLASS_COLORS.get(s.classification or "unknown", OKABE_ITO["grey"])
        lo, hi = num(r.qps_low), num(r.qps_high)
        xerr = [[max(0.0, q - src.rate(lo))], [max(0.0, src.rate(hi) - q)]] if finite(lo, hi) else None
        ax.barh(
            y,
            q - xmin,
            left=xmin,
            height=0.5,
            color=color,
            alpha=0.9,
            xerr=xerr,
            error_kw={"ecolor": INK, "capsize": 3, "linewidth": 1},
        )
        ax.text(
            q,
            y + 0.3,
            f"{rate_text(q)} items/s · {r.executor if 'executor' in r.keys else '?'} × "
            f"{r.concurrency if 'concurrency' in r.keys else '?'}",
            va="bottom",
            ha="right" if not log else "center",
            fontsize=8.5,
            color=INK,
            zorder=4,
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 1.0},
        )
    ax.set_yticks(ys)
    ax.set_yticklabels([plot_text(s.name if "name" in s.keys else "?", 32) for s, _ in stages])
    for v, label, style, color in lines:
        if v <= xmax * 1.05:
            # the solid prediction goes underneath: a bound equal to it stays visible on top
            solid = style == "-"
            ax.axvline(
                v,
                linestyle=style,
                color=color,
                linewidth=3.2 if solid else 1.8,
                alpha=0.35 if solid else 1.0,
                zorder=2 if solid else 3,
                label=label,
            )
    ax.set_xlim(xmin, xmax)
    ax.xaxis.set_major_formatter(FuncFormatter(si_label))
    ax.set_xlabel("throughput at the recommended setting (items/s" + (", log scale)" if log else ")"))
    handles, _ = ax.get_legend_handles_labels()
    seen = dict.fromkeys(s.classification or "unknown" for s, _ in stages)
    handles += [
        matplotlib.patches.Patch(color=CLASS_COLORS.get(c, OKABE_ITO["grey"]), alpha=0.9, label=c) for c in seen
    ]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return figure_to_svg(fig)
