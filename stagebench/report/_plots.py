"""What every figure of the HTML reports shares: the theme, the colours, the axes' helpers, and the
deterministic SVG text a figure becomes. The figures are drawn by role: a pipeline's
(``_stage_plots``), a loader's (``_loader_plots``), and runs or settings side by side
(``_compare_plots``).

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

Each figure takes rows or the typed summary's parts and returns SVG text (or
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

from stagebench._numbers import num_or_none

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.typing import RcKeyType  # for the checker only: not in every matplotlib the package allows

__all__ = [
    "OKABE_ITO",
    "EXECUTOR_COLORS",
    "CLASS_COLORS",
    "usl_curve",
    "figure_to_svg",
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

INK = "#222222"
GRID = "#E3E3E3"
_RC: dict[RcKeyType, Any] = {
    "svg.hashsalt": "stagebench",  # fixed ids: same figure, same bytes
    "svg.fonttype": "none",
    "figure.autolayout": False,  # the figures bring their own layout (see figure_to_svg)
    "figure.constrained_layout.use": False,
    "font.size": 9.5,
    "axes.edgecolor": "#9A9A9A",
    "axes.labelcolor": INK,
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


def plot_text(s: Any, limit: int = 48) -> str:
    """A user string made safe for matplotlib: no mathtext, bounded length, one line."""
    s = " ".join(str(s).split())
    if len(s) > limit:
        s = s[: limit - 1] + "…"
    return s.replace("$", r"\$")


def themed(fn):
    """Run a plotting function inside the report's rc settings (scoped, not global:
    axes read rcParams when they are created, so the whole drawing happens inside)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with matplotlib.rc_context(_RC):
            return fn(*args, **kwargs)

    return wrapper


def new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=96, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def figure_axes(width: float, height: float) -> tuple[Figure, Axes]:
    """A figure of one axes, styled."""
    fig = new_figure(width, height)
    ax = fig.add_subplot()
    style_axes(ax)
    return fig, ax


def figure_to_svg(fig: Figure) -> str:
    """The figure as standalone SVG text, byte-identical for identical figures.

    The constrained layout runs once, here, and is then fixed: ``savefig`` on
    a figure that keeps its layout engine draws it twice (a hidden draw that
    lays it out, then the real one), about a quarter of a report's time. Axes
    land within ~1.5 pt of where the second pass would put them.
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
    no-op rotations, no metadata, no indentation.
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


def style_axes(ax) -> None:
    ax.grid(True, color=GRID, linewidth=0.8)
    ax.set_axisbelow(True)


def shade_band(ax, x: np.ndarray, lo: np.ndarray, hi: np.ndarray, color: str, alpha: float) -> None:
    """A series' interval, shaded where both ends are known."""
    band = np.isfinite(lo) & np.isfinite(hi)
    if band.any():
        ax.fill_between(x[band], lo[band], hi[band], color=color, alpha=alpha, linewidth=0)


def recommended_star(ax, x: float, y: float, label: str) -> None:
    """The recommended setting: a yellow star over every series."""
    ax.plot(
        [x],
        [y],
        marker="*",
        markersize=17,
        color=OKABE_ITO["yellow"],
        markeredgecolor=INK,
        markeredgewidth=1.1,
        linestyle="none",
        label=label,
        zorder=5,
    )


def log2_axis(ax, levels: Iterable[float]) -> None:
    levels = sorted({int(c) for c in levels if c and c > 0})
    ax.set_xscale("log", base=2)
    if levels:
        ax.xaxis.set_major_locator(FixedLocator(levels))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlim(levels[0] / 1.25, levels[-1] * 1.25)


def usl_curve(c: np.ndarray, fit: Mapping[str, Any], points: pd.DataFrame | None = None) -> np.ndarray | None:
    """X(c) = λc / (1 + σ(c−1) + κc(c−1)) from a summary ``fit`` entry.

    λ is read from the fit when present (``lambda``); otherwise it is the
    least-squares scale of the fitted shape through the measured ``points``
    (closed form: λ = Σ q·g / Σ g² with g the shape at each level).
    """
    sigma, kappa = num_or_none(fit.get("sigma")), num_or_none(fit.get("kappa"))
    if sigma is None or kappa is None:
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


def ok_rows(df: pd.DataFrame, value: str = "qps") -> pd.DataFrame:
    out = df[(df["status"] == "ok") & df[value].notna()] if len(df) else df
    return out.sort_values("concurrency") if "concurrency" in out else out


def as_numeric(df: pd.DataFrame, cols: Sequence[str]) -> pd.DataFrame:
    df = df.copy()
    for c in cols:
        if c in df:
            df[c] = pd.to_numeric(df[c], errors="coerce")
    return df


def nw_axis(ax, nws: Sequence[int]) -> dict[int, int]:
    """num_workers on evenly spaced positions (0 has no log): 0, 1, 2, 4, 8 read like a log2 axis."""
    pos = {nw: i for i, nw in enumerate(sorted(nws))}
    ax.set_xticks(list(pos.values()))
    ax.set_xticklabels([str(n) for n in pos])
    ax.set_xlim(-0.4, len(pos) - 0.6)
    return pos
