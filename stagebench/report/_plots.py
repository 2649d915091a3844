"""Figures for the HTML reports, rendered to deterministic SVG text.

Why this way:

* matplotlib's object-oriented API (a bare :class:`~matplotlib.figure.Figure`
  on an Agg canvas), never ``pyplot``: pyplot keeps global figure state, which
  leaks memory in long processes and breaks when called from worker threads.
* SVG with text kept as ``<text>`` (``svg.fonttype: none``): small, sharp at
  any zoom, and a user-given stage name stays text (matplotlib escapes it)
  instead of becoming glyph outlines.
* Same rows, same bytes: the SVG id salt is fixed and the date is left out,
  so rebuilding a report from saved rows reproduces the file exactly.
* Okabe-Ito colours (distinguishable with the common colour-vision
  deficiencies) plus a second cue (line style or marker) for every series.

Each public function takes plain rows/summary dicts and returns SVG text (or
``None`` when there is nothing to draw); the report embeds them as images.
"""

from __future__ import annotations

import functools
import io
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import matplotlib
import matplotlib.patches
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from stagebench._numbers import finite, num
from stagebench.model._job import JobVerdict
from stagebench.model._loader import LoaderPoint, WorkerCosts
from stagebench.model._stage import StageEntry, StageSetting
from stagebench.model._summary import Summary

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.typing import RcKeyType  # for the checker only: not in every matplotlib the package allows

__all__ = [
    "OKABE_ITO",
    "EXECUTOR_COLORS",
    "CLASS_COLORS",
    "usl_curve",
    "figure_to_svg",
    "stage_throughput_svg",
    "stage_resources_svg",
    "pipeline_overview_svg",
    "loader_throughput_svg",
    "loader_heatmap_svg",
    "loader_startup_memory_svg",
    "compare_curves_svg",
    "compare_best_svg",
    "job_svg",
    "worker_startup_svg",
    "worker_memory_svg",
]

#: Okabe & Ito (2008), "Color Universal Design".
OKABE_ITO = {
    "orange": "#E69F00",
    "sky": "#56B4E9",
    "green": "#009E73",
    "yellow": "#F0E442",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "purple": "#CC79A7",
    "black": "#000000",
    "grey": "#8C8C8C",
}
EXECUTOR_COLORS = {"thread": OKABE_ITO["blue"], "process": OKABE_ITO["vermillion"], "async": OKABE_ITO["green"]}
EXECUTOR_MARKERS = {"thread": "o", "process": "s", "async": "^"}
HARNESS_STYLES = {"direct": "-", "spdl": "--"}
CLASS_COLORS = {
    "gil-bound": OKABE_ITO["vermillion"],
    "cpu-bound": OKABE_ITO["orange"],
    "io-bound": OKABE_ITO["sky"],
    "overhead-bound": OKABE_ITO["purple"],
    "ipc-bound": OKABE_ITO["blue"],
    "unknown": OKABE_ITO["grey"],
}
#: Series colours for comparisons (run 1, run 2, ...), black last.
SERIES = ("blue", "vermillion", "green", "orange", "purple", "sky", "yellow", "black")
SERIES_COLORS = tuple(OKABE_ITO[k] for k in SERIES)
SERIES_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")

_INK = "#222222"
_GRID = "#E3E3E3"
_RC: dict[RcKeyType, Any] = {
    "svg.hashsalt": "stagebench",  # fixed ids: same figure, same bytes
    "svg.fonttype": "none",
    "figure.autolayout": False,  # the figures bring their own layout (see figure_to_svg)
    "figure.constrained_layout.use": False,
    "font.size": 9.5,
    "axes.edgecolor": "#9A9A9A",
    "axes.labelcolor": _INK,
    "axes.titlesize": 10.5,
    "axes.titleweight": "bold",
    "axes.titlelocation": "left",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "xtick.color": "#555555",
    "ytick.color": "#555555",
    "legend.frameon": False,
    "legend.fontsize": 8.5,
}


# --------------------------------------------------------------------------- helpers


def _text(s: Any, limit: int = 48) -> str:
    """A user string made safe for matplotlib: no mathtext, bounded length, one line."""
    s = " ".join(str(s).split())
    if len(s) > limit:
        s = s[: limit - 1] + "…"
    return s.replace("$", r"\$")


def _themed(fn):
    """Run a plotting function inside the report's rc settings (scoped, not global:
    axes read rcParams when they are created, so the whole drawing happens inside)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with matplotlib.rc_context(_RC):
            return fn(*args, **kwargs)

    return wrapper


def _figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=96, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _figure_axes(width: float, height: float) -> tuple[Figure, Axes]:
    """A figure of one axes, styled."""
    fig = _figure(width, height)
    ax = fig.add_subplot()
    _style_axes(ax)
    return fig, ax


def figure_to_svg(fig: Figure) -> str:
    """The figure as standalone SVG text, byte-identical for identical figures.

    The constrained layout runs once, here, and is then fixed: ``savefig`` on
    a figure that keeps its layout engine draws it twice (a hidden draw that
    lays it out, then the real one): a diagnosis report with seven figures
    took 2.9 s instead of 2.25 s (paired runs; 2.7 vs 1.7 s at a faster
    moment of this VM). Axes land within ~1.5 pt of where the second pass
    would put them.
    """
    buf = io.StringIO()
    with matplotlib.rc_context(_RC):
        engine = fig.get_layout_engine()
        if engine is not None:
            engine.execute(fig)
            fig.set_layout_engine(None)  # _RC turns off the rc defaults that would put one back
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": "stagebench (matplotlib)"})
    return compact_svg(buf.getvalue())


_FONT_DECL = re.compile(r"font-family: [^;\"]*;? ?")
_NOOP_ROTATE = re.compile(r' transform="rotate\(-?0 [-\d.]+ [-\d.]+\)"')
_LONG_DECIMALS = re.compile(r"(\d\.\d)\d+")
_STYLE_ATTR = re.compile(r'style="([^"]*)"')
_BETWEEN_TAGS = re.compile(r">\s+<")
_NEWLINES = re.compile(r"\s*\n\s*")


def compact_svg(svg: str) -> str:
    """The same drawing in fewer bytes: a report holds a dozen figures, and it is one file.

    matplotlib writes six decimals of a point (1/72 inch) per coordinate, the whole
    font fallback list on every label, a no-op rotation per label, an RDF metadata
    block, indentation, and each element's whole style inline. Here: one decimal (a
    1/720 inch step, invisible), one shared font rule, each distinct style once as a
    class (an SVG in an ``<img>`` is its own document: the names cannot clash), no
    no-op rotations, no metadata, no indentation. The demo's figures shrank from
    26-56 KB to about a third.
    """
    svg = re.sub(r"<metadata>.*?</metadata>", "", svg, flags=re.S)
    svg = _FONT_DECL.sub("", svg)
    svg = svg.replace(
        '<style type="text/css">', "<style type=\"text/css\">text{font-family:'DejaVu Sans',Arial,sans-serif}", 1
    )
    svg = _NOOP_ROTATE.sub("", svg)
    svg = _LONG_DECIMALS.sub(r"\1", svg)
    classes: dict[str, str] = {}

    def as_class(m: re.Match) -> str:
        return f'class="{classes.setdefault(m.group(1), f"s{len(classes)}")}"'

    svg = _STYLE_ATTR.sub(as_class, svg)
    rules = "".join(f".{name}{{{style}}}" for style, name in classes.items())
    svg = svg.replace('<style type="text/css">', f'<style type="text/css">{rules}', 1)
    svg = _BETWEEN_TAGS.sub("><", svg)
    return _NEWLINES.sub(" ", svg)


def _style_axes(ax) -> None:
    ax.grid(True, color=_GRID, linewidth=0.8)
    ax.set_axisbelow(True)


def _band(ax, x: np.ndarray, lo: np.ndarray, hi: np.ndarray, color: str, alpha: float) -> None:
    """A series' interval, shaded where both ends are known."""
    band = np.isfinite(lo) & np.isfinite(hi)
    if band.any():
        ax.fill_between(x[band], lo[band], hi[band], color=color, alpha=alpha, linewidth=0)


def _recommended_star(ax, x: float, y: float, label: str) -> None:
    """The recommended setting: a yellow star over every series."""
    ax.plot(
        [x],
        [y],
        marker="*",
        markersize=17,
        color=OKABE_ITO["yellow"],
        markeredgecolor=_INK,
        markeredgewidth=1.1,
        linestyle="none",
        label=label,
        zorder=5,
    )


def _log2_x(ax, levels: Iterable[float]) -> None:
    levels = sorted({int(c) for c in levels if c and c > 0})
    ax.set_xscale("log", base=2)
    if levels:
        ax.xaxis.set_major_locator(FixedLocator(levels))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        lo, hi = levels[0], levels[-1]
        ax.set_xlim(lo / 1.25, hi * 1.25)


def _scaled(v: float, spec: str) -> str:
    """``v`` formatted with ``spec``, in thousands (k) or millions (M) from 1,000 and 1,000,000."""
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:{spec}}M"
    if a >= 1e3:
        return f"{v / 1e3:{spec}}k"
    return f"{v:{spec}}"


def _si(v: float, _pos: Any = None) -> str:
    """Tick labels: 1.2k, 35k, 2M."""
    return _scaled(v, "g")


def fmt_rate(v: float) -> str:
    """A rate with three significant digits: 482, 3.81k, 1.16M."""
    if v is None or not math.isfinite(v):
        return "n/a"
    return _scaled(v, ".3g")


def usl_curve(c: np.ndarray, fit: Mapping[str, Any], points: pd.DataFrame | None = None) -> np.ndarray | None:
    """X(c) = λc / (1 + σ(c−1) + κc(c−1)) from a summary ``fit`` entry.

    λ is read from the fit when present (``lambda``); otherwise it is the
    least-squares scale of the fitted shape through the measured ``points``
    (closed form: λ = Σ q·g / Σ g² with g the shape at each level).
    """
    sigma, kappa = fit.get("sigma"), fit.get("kappa")
    if sigma is None or kappa is None:
        return None
    try:
        sigma, kappa = float(sigma), float(kappa)
    except (TypeError, ValueError):
        return None
    if not (math.isfinite(sigma) and math.isfinite(kappa)):
        return None

    def shape(x):
        x = np.asarray(x, dtype=float)
        return x / (1 + sigma * (x - 1) + kappa * x * (x - 1))

    lam = fit.get("lambda", fit.get("lam"))
    if lam is None and points is not None and len(points):
        g = shape(points["concurrency"].to_numpy(float))
        q = points["qps"].to_numpy(float)
        ok = np.isfinite(g) & np.isfinite(q)
        if ok.any() and float(np.sum(g[ok] ** 2)) > 0:
            lam = float(np.sum(q[ok] * g[ok]) / np.sum(g[ok] ** 2))
    if lam is None or not math.isfinite(float(lam)):
        return None
    return float(lam) * shape(c)


def _ok(df: pd.DataFrame, value: str = "qps") -> pd.DataFrame:
    out = df[(df["status"] == "ok") & df[value].notna()] if len(df) else df
    return out.sort_values("concurrency") if "concurrency" in out else out


def _numeric(df: pd.DataFrame, cols: Sequence[str]) -> pd.DataFrame:
    df = df.copy()
    for c in cols:
        if c in df:
            df[c] = pd.to_numeric(df[c], errors="coerce")
    return df


# --------------------------------------------------------------------------- per stage


@_themed
def stage_throughput_svg(rows: pd.DataFrame, stage: StageEntry | Mapping[str, Any] | None = None) -> str | None:
    """QPS vs concurrency for one stage: every executor × harness with its interval band,
    the ideal line from concurrency 1, the harness ceiling, the fitted USL curve and the
    recommended point.

    ``rows``: this stage's rows (role ``stage`` and ``ceiling``). ``stage``: its summary entry.
    """
    rows = _numeric(rows, ("concurrency", "qps", "qps_low", "qps_high"))
    entry = stage if isinstance(stage, StageEntry) else StageEntry.from_json(stage)
    st = rows[rows["role"] == "stage"]
    ok = _ok(st)
    if ok.empty:
        return None
    fig, ax = _figure_axes(8.4, 3.9)
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
        _band(ax, c, lo, hi, color, 0.16)
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
        ceil = _ok(rows[(rows["role"] == "ceiling") & (rows["harness"] == harness) & (rows["executor"] == ex)])
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
                above.append(f"{label} ceiling ≥ {fmt_rate(float(np.nanmin(cq)))}/s")
    # Ideal linear scaling from the best concurrency-1 point.
    one = ok[ok["concurrency"] == levels[0]]
    if len(one):
        q1 = float(one["qps"].max()) / levels[0]
        xs = np.array([levels[0], levels[-1]], dtype=float)
        ax.plot(xs, q1 * xs, "--", color=OKABE_ITO["grey"], linewidth=1, label="ideal (linear from c=1)", zorder=1)
    rec = entry.recommended or StageSetting()
    if rec.concurrency and rec.qps is not None:
        executor = rec.executor if "executor" in rec.keys else "?"
        _recommended_star(ax, rec.concurrency, rec.qps, f"recommended: {executor} × {rec.concurrency}")
    bad = st[st["status"] != "ok"]
    if len(bad):
        ax.plot(
            bad["concurrency"],
            np.zeros(len(bad)),
            "x",
            color=_INK,
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
    _log2_x(ax, levels)
    ax.yaxis.set_major_formatter(FuncFormatter(_si))
    ax.set_xlabel("concurrency (workers or tasks in flight, log₂ scale)")
    ax.set_ylabel("throughput (items/s)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return figure_to_svg(fig)


@_themed
def stage_resources_svg(rows: pd.DataFrame, usable_cores: float | None = None) -> str | None:
    """Cores used, latency p50/p99 and memory vs concurrency, one panel each."""
    rows = _numeric(
        rows, ("concurrency", "cores_used", "latency_p50_ms", "latency_p99_ms", "mem_pss_mb", "mem_peak_mb", "qps")
    )
    ok = _ok(rows[rows["role"] == "stage"])
    if ok.empty:
        return None
    levels = sorted(set(ok["concurrency"].astype(int)))
    fig = _figure(10.0, 2.9)
    axes = fig.subplots(1, 3)
    groups = list(ok.groupby(["harness", "executor"], sort=True))
    multi_h = ok["harness"].nunique() > 1
    for (harness, ex), g in groups:
        color = EXECUTOR_COLORS.get(ex, _INK)
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
        _style_axes(ax)
        _log2_x(ax, levels)
        ax.set_xlabel("concurrency (log₂)")
    axes[0].legend(loc="lower right")
    axes[1].legend(loc="upper left", fontsize=7.5, ncol=1)
    return figure_to_svg(fig)


def _recommended_with_qps(s: StageEntry) -> StageSetting | None:
    """The stage's recommended setting where it has a throughput above zero, else None."""
    r = s.recommended
    return r if r is not None and finite(r.qps) and num(r.qps) > 0 else None


@_themed
def pipeline_overview_svg(summary: Mapping[str, Any]) -> str | None:
    """Each stage's recommended throughput (with interval) against the pipeline's bounds.

    One glance shows the bottleneck: the shortest bar, unless the cores or GIL line
    sits left of every bar. When the stages differ by more than 10x (a batching
    stage next to a decoder) the axis is logarithmic, or the slow stages vanish.
    """
    sm = Summary.from_json(summary)
    stages = [(s, r) for s in map(StageEntry.from_json, sm.stages) if (r := _recommended_with_qps(s)) is not None]
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
            lines.append((float(v), f"{label}: {fmt_rate(float(v))}/s", style, color))
    if pred.qps is not None and finite(pred.qps) and float(pred.qps) > 0:
        lines.append((float(pred.qps), f"predicted pipeline: {fmt_rate(float(pred.qps))}/s", "-", _INK))
    if val.qps is not None and finite(val.qps) and float(val.qps) > 0:
        lines.append((float(val.qps), f"measured pipeline: {fmt_rate(float(val.qps))}/s", ":", OKABE_ITO["green"]))
    # One unit with the bound and pipeline lines: source items/s. A stage after a batch of 16 handles
    # 16 source items per call, so its calls/s times 16 is what it can feed the pipeline.
    per_call = [s.items_per_input for s, _ in stages]
    vals = [num(r.qps) * k for (_, r), k in zip(stages, per_call)]
    lo_all = min(vals + [v for v, *_ in lines])
    log = max(vals) / lo_all > 10
    xmin, xmax = (lo_all / 2, max(vals) * 6) if log else (0.0, max(vals) * 1.3)

    fig, ax = _figure_axes(8.4, 0.75 * len(stages) + 1.2)
    ax.grid(True, axis="x", color=_GRID)
    ax.grid(False, axis="y")
    if log:
        ax.set_xscale("log")
    ys = np.arange(len(stages))[::-1]
    for y, (s, r), q, k in zip(ys, stages, vals, per_call):
        color = CLASS_COLORS.get(s.classification or "unknown", OKABE_ITO["grey"])
        lo, hi = r.qps_low, r.qps_high
        xerr = None
        if lo is not None and hi is not None and finite(lo, hi):
            xerr = [[max(0.0, q - float(lo) * k)], [max(0.0, float(hi) * k - q)]]
        ax.barh(
            y,
            q - xmin,
            left=xmin,
            height=0.5,
            color=color,
            alpha=0.9,
            xerr=xerr,
            error_kw={"ecolor": _INK, "capsize": 3, "linewidth": 1},
        )
        ax.text(
            q,
            y + 0.3,
            f"{fmt_rate(q)} items/s · {r.executor if 'executor' in r.keys else '?'} × "
            f"{r.concurrency if 'concurrency' in r.keys else '?'}",
            va="bottom",
            ha="right" if not log else "center",
            fontsize=8.5,
            color=_INK,
            zorder=4,
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 1.0},
        )
    ax.set_yticks(ys)
    ax.set_yticklabels([_text(s.name if "name" in s.keys else "?", 32) for s, _ in stages])
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
    ax.xaxis.set_major_formatter(FuncFormatter(_si))
    ax.set_xlabel("throughput at the recommended setting (items/s" + (", log scale)" if log else ")"))
    handles, _ = ax.get_legend_handles_labels()
    seen = []
    for s, _ in stages:
        c = s.classification or "unknown"
        if c not in seen:
            seen.append(c)
    handles += [
        matplotlib.patches.Patch(color=CLASS_COLORS.get(c, OKABE_ITO["grey"]), alpha=0.9, label=c) for c in seen
    ]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return figure_to_svg(fig)


# --------------------------------------------------------------------------- loader

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
    rows = _numeric(rows, _LOADER_NUM)
    return rows[(rows["status"] == "ok") & rows["samples_per_s"].notna()]


def _nw_axis(ax, nws: Sequence[int]) -> dict[int, int]:
    """num_workers on evenly spaced positions (0 has no log): 0, 1, 2, 4, 8 read like a log2 axis."""
    pos = {nw: i for i, nw in enumerate(sorted(nws))}
    ax.set_xticks(list(pos.values()))
    ax.set_xticklabels([str(n) for n in pos])
    ax.set_xlim(-0.4, len(pos) - 0.6)
    return pos


def _pf_label(pf: Any) -> str:
    return "—" if pf is None or (isinstance(pf, float) and math.isnan(pf)) else f"{int(pf)}"


@_themed
def loader_throughput_svg(rows: pd.DataFrame, summary: Mapping[str, Any] | None = None) -> str | None:
    """samples/s vs num_workers, one line per prefetch_factor (and persistent_workers setting)."""
    ok = _loader_ok(rows)
    if ok.empty:
        return None
    fig, ax = _figure_axes(8.4, 3.6)
    pos = _nw_axis(ax, sorted(set(ok["num_workers"].astype(int))))
    zero = ok[ok["num_workers"] == 0]
    with_w = ok[ok["num_workers"] > 0].copy()
    with_w["pf"] = with_w["prefetch_factor"].map(_pf_label)
    multi_pw = with_w["persistent_workers"].astype(str).nunique() > 1
    for i, ((pf, pw), g) in enumerate(with_w.groupby(["pf", with_w["persistent_workers"].astype(str)], sort=True)):
        g = g.sort_values("num_workers").groupby("num_workers", as_index=False).max(numeric_only=True)
        color = SERIES_COLORS[i % len(SERIES_COLORS)]
        x = [pos[int(n)] for n in g["num_workers"]]
        lo, hi = g["samples_per_s_low"].to_numpy(float), g["samples_per_s_high"].to_numpy(float)
        _band(ax, np.array(x), lo, hi, color, 0.15)
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
            color=_INK,
            markersize=6,
            capsize=3,
            label="num_workers=0 (main process)",
        )
        ax.axhline(q, color=OKABE_ITO["grey"], linestyle=":", linewidth=1)
    rec = LoaderPoint.from_json(Summary.from_json(summary).recommended)
    if rec.samples_per_s is not None and rec.num_workers is not None and rec.num_workers in pos:
        _recommended_star(
            ax,
            pos[rec.num_workers],
            rec.samples_per_s.value,
            f"recommended: num_workers={rec.num_workers}, prefetch_factor={_pf_label(rec.prefetch_factor)}",
        )
    target = (summary or {}).get("target") or {}
    if target.get("rate"):
        ax.axhline(
            float(target["rate"]),
            color=OKABE_ITO["green"],
            linestyle="--",
            linewidth=1.4,
            label=f"target: {fmt_rate(float(target['rate']))} samples/s",
        )
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_formatter(FuncFormatter(_si))
    ax.set_xlabel("num_workers (worker processes)")
    ax.set_ylabel("throughput (samples/s)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return figure_to_svg(fig)


def _yerr(r: pd.Series):
    rate = LoaderPoint.from_json(r.to_dict()).samples_per_s
    if rate is None or rate.low is None or rate.high is None:
        return None
    return [[max(0.0, rate.value - rate.low)], [max(0.0, rate.high - rate.value)]]


@_themed
def loader_heatmap_svg(rows: pd.DataFrame, summary: Mapping[str, Any] | None = None) -> str | None:
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
    fig = _figure(8.4, 0.55 * len(pfs) + 1.7)
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
                ax.text(j, i, fmt_rate(v), ha="center", va="center", fontsize=8.5, color=_INK if light else "white")
    rec = LoaderPoint.from_json(Summary.from_json(summary).recommended)
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
    cb.formatter = FuncFormatter(_si)
    cb.update_ticks()
    return figure_to_svg(fig)


@_themed
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
    fig = _figure(10.0, 2.9)
    a0, a1 = fig.subplots(1, 2)
    for ax in (a0, a1):
        _style_axes(ax)
    pos = _nw_axis(a0, list(by["num_workers"].astype(int)))
    _nw_axis(a1, list(by["num_workers"].astype(int)))
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


# --------------------------------------------------------------------------- comparisons


@_themed
def compare_curves_svg(
    series: Sequence[Mapping[str, Any]], *, xlabel: str, ylabel: str, log2_x: bool, title: str | None = None
) -> str | None:
    """Overlaid curves, one per run: ``{"label", "x", "y", "low", "high", "rec_x", "rec_y"}``."""
    series = [s for s in series if len(s.get("x", ()))]
    if not series:
        return None
    # the legend sits beside the axes, one line a run: the figure grows with it (about 0.2 in a
    # line) so that comparing many runs does not crush the axes to nothing
    fig, ax = _figure_axes(8.4, max(3.6, 0.2 * len(series) + 0.9))
    xs_all = sorted({float(v) for s in series for v in s["x"]})
    pos = None
    if log2_x and all(v > 0 for v in xs_all):
        _log2_x(ax, xs_all)
    else:
        pos = _nw_axis(ax, [int(v) for v in xs_all])
    for i, s in enumerate(series):
        # colour and marker together tell runs apart (and without colour): past eight runs the
        # colours repeat and the markers shift by one, so no pair repeats before 64 runs
        color = SERIES_COLORS[i % len(SERIES_COLORS)]
        marker = SERIES_MARKERS[(i + i // len(SERIES_COLORS)) % len(SERIES_MARKERS)]
        x = np.asarray(s["x"], float)
        xp = x if pos is None else np.array([pos[int(v)] for v in x], float)
        y = np.asarray(s["y"], float)
        lo, hi = np.asarray(s.get("low", y), float), np.asarray(s.get("high", y), float)
        _band(ax, xp, lo, hi, color, 0.15)
        ax.plot(xp, y, "-", color=color, marker=marker, markersize=5, linewidth=2, label=_text(s["label"], 40))
        if s.get("rec_x") is not None and s.get("rec_y") is not None:
            rx = float(s["rec_x"]) if pos is None else pos.get(int(s["rec_x"]))
            if rx is not None:
                ax.plot(
                    [rx],
                    [s["rec_y"]],
                    marker="*",
                    markersize=15,
                    color=color,
                    markeredgecolor=_INK,
                    linestyle="none",
                    zorder=5,
                )
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_formatter(FuncFormatter(_si))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(_text(title, 60))
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, title="★ recommended")
    return figure_to_svg(fig)


@_themed
def compare_best_svg(entries: Sequence[Mapping[str, Any]], *, unit: str) -> str | None:
    """Best throughput per run with its interval, winner on top: ``{"label", "value", "low", "high"}``."""
    entries = [e for e in entries if e.get("value") is not None and math.isfinite(float(e["value"]))]
    if not entries:
        return None
    entries = sorted(entries, key=lambda e: float(e["value"]))
    fig, ax = _figure_axes(8.4, 0.5 * len(entries) + 1.3)
    ax.grid(False, axis="y")
    ys = np.arange(len(entries))
    for y, e in enumerate(entries):  # ys[y] == y; a plain int, as Axes.text's stubs want
        v = float(e["value"])
        lo, hi = e.get("low"), e.get("high")
        xerr = None
        if lo is not None and hi is not None and math.isfinite(float(lo)) and math.isfinite(float(hi)):
            xerr = [[max(0.0, v - float(lo))], [max(0.0, float(hi) - v)]]
        color = OKABE_ITO["blue"] if y == ys[-1] else OKABE_ITO["grey"]
        ax.barh(y, v, height=0.6, color=color, xerr=xerr, error_kw={"ecolor": _INK, "capsize": 3})
        right = v + (xerr[1][0] if xerr else 0.0)
        ax.text(right, y, f"  {fmt_rate(v)}", va="center", ha="left", fontsize=8.5)
    ax.set_yticks(ys)
    ax.set_yticklabels([_text(e["label"], 40) for e in entries])
    ax.set_xlim(0, max(float(e.get("high") or e["value"]) for e in entries) * 1.25)
    ax.xaxis.set_major_formatter(FuncFormatter(_si))
    ax.set_xlabel(f"best throughput ({unit}), 95% interval")
    return figure_to_svg(fig)


@_themed
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
    fig, ax = _figure_axes(8.4, 0.55 * len(cands) + 1.5)
    ax.grid(False, axis="y")
    if log:
        ax.set_xscale("log")
    for y, (c, f) in enumerate(reversed(cands)):
        v = num(f.samples_per_s)
        lo, hi = num(f.samples_per_s_low), num(f.samples_per_s_high)
        xerr = [[max(0.0, v - lo)], [max(0.0, hi - v)]] if finite(lo, hi) and lo > left else None
        color = OKABE_ITO["blue"] if c.key == job.pick else OKABE_ITO["grey"]
        ax.barh(y, v - left, left=left, height=0.6, color=color, xerr=xerr, error_kw={"ecolor": _INK, "capsize": 3})
        alone = num(c.alone.value if c.alone is not None else None)
        if finite(alone):
            ax.plot([alone], [y], marker="D", color=OKABE_ITO["orange"], markersize=6, linestyle="none")
    if finite(demand):
        ax.axvline(demand, color=OKABE_ITO["vermillion"], linestyle="--", linewidth=1.2)
    ax.set_yticks(np.arange(len(cands)))
    ax.set_yticklabels([_text(c.label, 44) for c, _ in reversed(cands)])
    ax.set_xlim(left, top * (1.5 if log else 1.15))
    ax.xaxis.set_major_formatter(FuncFormatter(_si))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    ax.set_xlabel(
        f"{unit}{' (log scale)' if log else ''}: your job (bars, 95% interval) · alone (◆) · your step alone (dashed)"
    )
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
    fig, ax = _figure_axes(8.4, 0.5 * len(rows) + 2.1)
    ax.grid(False, axis="y")
    for y, r in enumerate(reversed(rows)):
        left = 0.0
        for key, label, color in parts:
            v = max(0.0, num(r.value(key)) if finite(r.value(key)) else 0.0)
            ax.barh(y, v, left=left, height=0.6, color=color, label=label if y == 0 else None)
            left += v
        last = num(r.workers_start_last_s)
        if finite(last):
            ax.plot([last], [y], marker="|", color=_INK, markersize=14, linestyle="none")
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
    fig, ax = _figure_axes(8.4, 3.2)
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
