"""The figures of a loader run: samples/s against num_workers, the settings as a heat map, start-up
and memory against num_workers, and what each worker costs (start-up split, memory over the pass).

Theme, colours and the SVG text they become: :mod:`stagebench.report._plots`.
"""

from __future__ import annotations

import math
from typing import Any

import matplotlib.patches
import numpy as np
import pandas as pd
from matplotlib.ticker import FuncFormatter

from stagebench._numbers import finite, num
from stagebench.model._loader import LoaderPoint, WorkerCosts
from stagebench.report._html import rate_text, si_label
from stagebench.report._plots import (
    INK,
    OKABE_ITO,
    SERIES_COLORS,
    SERIES_MARKERS,
    as_numeric,
    figure_axes,
    figure_to_svg,
    new_figure,
    nw_axis,
    recommended_star,
    shade_band,
    style_axes,
    themed,
)

__all__ = [
    "loader_throughput_svg",
    "loader_heatmap_svg",
    "loader_startup_memory_svg",
    "worker_startup_svg",
    "worker_memory_svg",
]


_LOADER_NUM = (
    "num_workers",
    "prefetch_factor",
    "samples_per_s",
    "samples_per_s_low",
    "samples_per_s_high",
    "time_to_first_batch_s",
    "epoch_stall_s",
    "cores_used",
    "mem_pss_mb",
    "mem_uss_mb",
    "mem_main_mb",
    "mem_workers_mb",
)


def _loader_ok(rows: pd.DataFrame) -> pd.DataFrame:
    rows = as_numeric(rows, _LOADER_NUM)
    return rows[(rows["status"] == "ok") & rows["samples_per_s"].notna()]


def _pf_label(pf: Any) -> str:
    return "—" if pf is None or (isinstance(pf, float) and math.isnan(pf)) else f"{int(pf)}"


@themed
def loader_throughput_svg(
    rows: pd.DataFrame, recommended: LoaderPoint | None = None, target_rate: Any = None
) -> str | None:
    """samples/s vs num_workers, one line per prefetch_factor (and persistent_workers setting)."""
    ok = _loader_ok(rows)
    if ok.empty:
        return None
    fig, ax = figure_axes(8.4, 3.6)
    pos = nw_axis(ax, sorted(set(ok["num_workers"].astype(int))))
    zero = ok[ok["num_workers"] == 0]
    with_w = ok[ok["num_workers"] > 0].copy()
    with_w["pf"] = with_w["prefetch_factor"].map(_pf_label)
    multi_pw = with_w["persistent_workers"].astype(str).nunique() > 1
    for i, ((pf, pw), g) in enumerate(with_w.groupby(["pf", with_w["persistent_workers"].astype(str)], sort=True)):
        g = g.sort_values("num_workers").groupby("num_workers", as_index=False).max(numeric_only=True)
        color = SERIES_COLORS[i % len(SERIES_COLORS)]
        x = [pos[int(n)] for n in g["num_workers"]]
        lo, hi = g["samples_per_s_low"].to_numpy(float), g["samples_per_s_high"].to_numpy(float)
        shade_band(ax, np.array(x), lo, hi, color, 0.15)
        label = f"prefetch_factor={pf}" + (f", persistent={pw}" if multi_pw else "")
        ax.plot(
            x,
            g["samples_per_s"],
            "-",
            color=color,
            marker=SERIES_MARKERS[i % len(SERIES_MARKERS)],
            markersize=5,
            linewidth=2,
            label=label,
        )
    if len(zero):
        q = float(zero["samples_per_s"].max())
        ax.errorbar(
            [pos[0]],
            [q],
            yerr=_yerr(zero.loc[zero["samples_per_s"].idxmax()]),
            fmt="D",
            color=INK,
            markersize=6,
            capsize=3,
            label="num_workers=0 (main process)",
        )
        ax.axhline(q, color=OKABE_ITO["grey"], linestyle=":", linewidth=1)
    rec = recommended or LoaderPoint()
    if rec.samples_per_s is not None and rec.num_workers is not None and rec.num_workers in pos:
        recommended_star(
            ax,
            pos[rec.num_workers],
            rec.samples_per_s.value,
            f"recommended: num_workers={rec.num_workers}, prefetch_factor={_pf_label(rec.prefetch_factor)}",
        )
    if target_rate:
        ax.axhline(
            float(target_rate),
            color=OKABE_ITO["green"],
            linestyle="--",
            linewidth=1.4,
            label=f"target: {rate_text(float(target_rate))} samples/s",
        )
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_formatter(FuncFormatter(si_label))
    ax.set_xlabel("num_workers (worker processes)")
    ax.set_ylabel("throughput (samples/s)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return figure_to_svg(fig)


def _yerr(r: pd.Series):
    rate = LoaderPoint.from_json(r.to_dict()).samples_per_s
    if rate is None or rate.low is None or rate.high is None:
        return None
    return [[max(0.0, rate.value - rate.low)], [max(0.0, rate.high - rate.value)]]


@themed
def loader_heatmap_svg(rows: pd.DataFrame, recommended: LoaderPoint | None = None) -> str | None:
    """num_workers × prefetch_factor → best samples/s measured there (cividis: readable in grey too)."""
    ok = _loader_ok(rows).copy()
    if ok.empty:
        return None
    ok["pf"] = ok["prefetch_factor"].map(_pf_label)
    table = ok.pivot_table(index="pf", columns="num_workers", values="samples_per_s", aggfunc="max")
    if table.shape[0] * table.shape[1] < 2:
        return None
    pfs = sorted(table.index, key=lambda p: (p != "—", int(p) if p != "—" else 0))
    table = table.reindex(index=pfs)
    nws = [int(n) for n in table.columns]
    fig = new_figure(8.4, 0.55 * len(pfs) + 1.7)
    ax = fig.add_subplot()
    data = table.to_numpy(float)
    masked = np.ma.masked_invalid(data)
    cmap = matplotlib.colormaps["cividis"].with_extremes(bad="#F2F2F2")
    im = ax.imshow(masked, cmap=cmap, aspect="auto", origin="lower")
    vmin, vmax = np.nanmin(data), np.nanmax(data)
    for i in range(data.shape[0]):
        for j in range(data.shape[1]):
            v = data[i, j]
            if math.isfinite(v):
                light = (v - vmin) / (vmax - vmin + 1e-12) > 0.55
                ax.text(j, i, rate_text(v), ha="center", va="center", fontsize=8.5, color=INK if light else "white")
    rec = recommended or LoaderPoint()
    if rec.num_workers is not None and rec.num_workers in nws:
        pf = _pf_label(rec.prefetch_factor) if rec.num_workers > 0 else "—"
        if pf in pfs:
            j, i = nws.index(rec.num_workers), pfs.index(pf)
            ax.add_patch(
                matplotlib.patches.Rectangle(
                    (j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor=OKABE_ITO["orange"], linewidth=3
                )
            )
    ax.set_xticks(range(len(nws)))
    ax.set_xticklabels([str(n) for n in nws])
    ax.set_yticks(range(len(pfs)))
    ax.set_yticklabels(pfs)
    ax.set_xlabel("num_workers")
    ax.set_ylabel("prefetch_factor")
    cb = fig.colorbar(im, ax=ax, pad=0.01)
    cb.set_label("samples/s")
    cb.formatter = FuncFormatter(si_label)
    cb.update_ticks()
    return figure_to_svg(fig)


@themed
def loader_startup_memory_svg(rows: pd.DataFrame, memory_budget_mb: float | None = None) -> str | None:
    """Time to first batch (and epoch-boundary stall) and memory vs num_workers."""
    ok = _loader_ok(rows)
    if ok.empty:
        return None
    by = (
        ok.groupby("num_workers")
        .agg(
            ttfb=("time_to_first_batch_s", "median"),
            stall=("epoch_stall_s", "median"),
            pss=("mem_pss_mb", "max"),
            main=("mem_main_mb", "max"),
            workers=("mem_workers_mb", "max"),
        )
        .reset_index()
    )
    fig = new_figure(10.0, 2.9)
    a0, a1 = fig.subplots(1, 2)
    for ax in (a0, a1):
        style_axes(ax)
    pos = nw_axis(a0, list(by["num_workers"].astype(int)))
    nw_axis(a1, list(by["num_workers"].astype(int)))
    x = [pos[int(n)] for n in by["num_workers"]]
    a0.plot(x, by["ttfb"], "-", color=OKABE_ITO["blue"], marker="o", label="time to first batch")
    if by["stall"].notna().any():
        a0.plot(x, by["stall"], "--", color=OKABE_ITO["vermillion"], marker="s", label="epoch-boundary stall")
    a0.set_ylim(bottom=0)
    a0.set_title("start-up")
    a0.set_ylabel("seconds")
    a0.set_xlabel("num_workers")
    a0.legend(loc="best")
    a1.plot(x, by["pss"], "-", color=OKABE_ITO["blue"], marker="o", label="total (PSS)")
    if by["main"].notna().any():
        a1.plot(x, by["main"], "--", color=OKABE_ITO["green"], marker="^", label="main process")
    if by["workers"].notna().any():
        a1.plot(x, by["workers"], ":", color=OKABE_ITO["vermillion"], marker="s", label="workers")
    top = float(np.nanmax(by[["pss", "main", "workers"]].to_numpy(float))) if by["pss"].notna().any() else 0.0
    if memory_budget_mb and memory_budget_mb <= 3 * top:
        a1.axhline(memory_budget_mb, color=OKABE_ITO["grey"], linestyle="-.", label="memory budget")
    elif memory_budget_mb:
        a1.text(
            0.98,
            0.03,
            f"memory budget {memory_budget_mb:,.0f} MB: far above",
            transform=a1.transAxes,
            ha="right",
            va="bottom",
            fontsize=8,
            color="#555555",
        )
    a1.set_ylim(bottom=0)
    a1.set_title("memory")
    a1.set_ylabel("memory (MB)")
    a1.set_xlabel("num_workers")
    a1.legend(loc="best")
    return figure_to_svg(fig)


def worker_startup_svg(costs: WorkerCosts | None) -> str | None:
    """Where each setting's time to its workers' first batch goes: one stacked bar per num_workers
    (medians over the workers), the last worker's start as a tick: the process started (its imports, the
    dataset shipped to it), the user's worker_init_fn, the first batch's own work, its delivery."""
    every = costs.startup if costs is not None else ()
    rows = [r for r in every if finite(r.workers_start_s)]
    waiting = ("workers_created_s", "waiting to be started (workers before it, dataset pickled)", OKABE_ITO["sky"])
    delivery = ("first_delivery_s", "delivered to the loop", OKABE_ITO["grey"])
    parts: tuple[tuple[str, str, str], ...]
    if not rows:  # SPDL's loader: no worker_init_fn to time by, the worker's own part whole
        rows = [r for r in every if finite(r.worker_unsplit_s) and finite(r.workers_created_s)]
        if not rows:
            return None
        own = ("worker_unsplit_s", "process start, dataset loaded, first batch's work (not split)", OKABE_ITO["blue"])
        parts = (waiting, own, delivery)
    else:
        # the start in its two parts where every row has them (a worker's creation read from /proc), else whole
        split = all(finite(r.workers_created_s) and finite(r.worker_boot_s) for r in rows)
        boot = ("worker_boot_s", "process start: imports, dataset loaded", OKABE_ITO["blue"])
        start = (waiting, boot) if split else (("workers_start_s", "process started, dataset shipped", boot[2]),)
        parts = (
            *start,
            ("worker_init_s", "worker_init_fn", OKABE_ITO["orange"]),
            ("first_batch_work_s", "first batch's work", OKABE_ITO["green"]),
            delivery,
        )
    fig, ax = figure_axes(8.4, 0.5 * len(rows) + 2.1)
    ax.grid(False, axis="y")
    for y, r in enumerate(reversed(rows)):
        left = 0.0
        for key, label, color in parts:
            v = max(0.0, num(getattr(r, key)) if finite(getattr(r, key)) else 0.0)
            ax.barh(y, v, left=left, height=0.6, color=color, label=label if y == 0 else None)
            left += v
        last = num(r.workers_start_last_s)
        if finite(last):
            ax.plot([last], [y], marker="|", color=INK, markersize=14, linestyle="none")
    ax.set_yticks(np.arange(len(rows)))
    ax.set_yticklabels([f"num_workers={r.num_workers}" for r in reversed(rows)])
    ax.set_xlabel("seconds from iter() to a worker's first batch (medians over the workers; | the last worker's start)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=3, fontsize=8, frameon=False)
    return figure_to_svg(fig)


def worker_memory_svg(costs: WorkerCosts | None) -> str | None:
    """Each worker's private memory (USS) against the batches it made, over the memory pass at the pick."""
    mem = costs.memory if costs is not None else None
    samples = (mem.samples if mem is not None else None) or ()
    if mem is None or len(samples) < 2:
        return None
    fig, ax = figure_axes(8.4, 3.2)
    pids = sorted({pid for s in samples for pid in s.uss_mb})
    for i, pid in enumerate(pids):
        both = [s for s in samples if pid in s.uss_mb and pid in s.batches]
        xs = [s.batches[pid] for s in both]
        ys = [s.uss_mb[pid] for s in both]
        ax.plot(xs, ys, marker="o", markersize=3, color=list(OKABE_ITO.values())[i % 8], label=f"worker {i}")
    ax.set_xlabel(f"batches the worker made (num_workers={mem.num_workers})")
    ax.set_ylabel("private memory (USS, MB)")
    ax.set_ylim(bottom=0)  # from zero: a flat line is no growth, whatever its decimals
    if len(pids) <= 8:
        ax.legend(loc="upper left", fontsize=8, frameon=False)
    return figure_to_svg(fig)
