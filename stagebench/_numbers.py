"""Numbers as the rows and summaries hold them: one test for "a finite number", one way to write one.

Rows come back from CSV and JSON as floats, numpy scalars, None or NaN; every
layer asks the same questions of them, so they are answered once, here.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = [
    "finite",
    "num",
    "num_or_none",
    "fmt_q",
    "fmt_ms",
    "fmt_ms_each",
    "fmt_share_of",
    "fmt_above",
    "fmt_cores",
    "SourceItems",
]


def finite(*xs: Any) -> bool:
    """Whether every ``x`` is a finite number (numpy scalars and numeric text included; None and NaN are not)."""
    return all(not math.isnan(num(x)) for x in xs)


def num(x: Any) -> float:
    """A float, NaN for anything that is not a finite number."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return math.nan
    return v if math.isfinite(v) else math.nan


def num_or_none(x: Any) -> float | None:
    """A float, None for anything that is not a finite number."""
    v = num(x)
    return None if math.isnan(v) else v


def fmt_q(q: float) -> str:
    """A throughput in prose: ``1,234`` from 10 up, three significant digits below."""
    return f"{q:,.0f}" if q >= 10 else f"{q:.3g}"


def fmt_ms(s: float, *, unit_of: float | None = None) -> str:
    """A duration in prose: ``4.56 ms``; from a second up, in seconds (``1.15 s``, not ``1.15e+03 ms``); under
    10 µs, in microseconds (``0.3 µs``, not ``0.0003 ms``; ``0.0704 µs``, not ``7.04e-05 ms``: a harness's cost
    per item, a grouped stage's call over its items). ``unit_of``: the duration whose unit this one takes
    (:func:`fmt_ms_each`)."""
    u = s if unit_of is None else unit_of
    if u >= 1:
        return f"{s:.3g} s"
    if 0 < u < 1e-5:
        return f"{s * 1e6:.3g} µs"
    ms = s * 1e3
    if 0 < ms < 1e-4:  # a part under 0.1 µs in a sentence read in ms: "0.00005 ms", not "5e-05 ms"
        import numpy as np  # only here: this module loads in every process, most of which never get here

        return f"{np.format_float_positional(ms, precision=3, unique=False, fractional=False, trim='-')} ms"
    return f"{ms:.3g} ms"


def fmt_ms_each(*xs: float) -> list[str]:
    """Durations set side by side in one sentence, in one unit: :func:`fmt_ms`'s for the smallest above 0, so
    long as the largest reads there without an exponent (``2.01 µs ... and 254 µs``, not ``2.01 µs ... and
    0.254 ms``); in ms where the largest is a millisecond or more; each its own from a second up."""
    pos = [x for x in xs if finite(x) and x > 0]
    if not pos or max(pos) >= 1:
        return [fmt_ms(x) for x in xs]
    lo = min(pos)
    unit = lo if max(pos) < 9.995e-4 else max(lo, 1e-5)  # 999.5 µs reads "1e+03 µs"
    return [fmt_ms(x, unit_of=unit) for x in xs]


def fmt_cores(n: float) -> str:
    """``1 core``, ``2 cores``, ``1.5 cores``: a count of cores in prose (a 1-CPU quota reads "on 1 core")."""
    return f"{n:g} core{'' if n == 1 else 's'}"


def fmt_share_of(share: float) -> str:
    """``"93% of"`` for a rate against its no-op ceiling, or ``"at"`` above it (``fmt_above`` says why)."""
    return f"{share:.0%} of" if share <= 1 else "at"


def fmt_above(share: float) -> str:
    """A rate read above its no-op ceiling is noise between two points measured apart: said, not shown as a share."""
    if share <= 1:
        return ""
    return f"; it read {share - 1:.0%} above it, which only the noise between two points measured apart can do"


class SourceItems:
    """A stage's per-call figures in source items, the one unit a report states rates and times in.

    A stage after a batching step handles ``k`` source items per call (``items_per_input``): its rate
    per call times ``k`` is what it feeds the pipeline, its time per call over ``k`` what one source
    item costs it. ``k`` of 1 (or None, 0, no number) leaves every figure as read.
    """

    __slots__ = ("k",)

    def __init__(self, k: Any = 1.0) -> None:
        self.k = num_or_none(k) or 1.0

    def rate(self, per_call: Any) -> Any:
        """Calls/s in source items/s (anything but a number kept as it is)."""
        x = num_or_none(per_call)
        return x * self.k if x is not None else per_call

    def per_item(self, per_call: Any) -> Any:
        """A figure per call (seconds, bytes) per source item (anything but a number kept as it is)."""
        x = num_or_none(per_call)
        return x / self.k if x is not None else per_call

    def q(self, per_call: Any) -> str:
        """A rate per call in prose, in source items/s (:func:`fmt_q`)."""
        return fmt_q(self.rate(per_call))

    def ms(self, per_call: Any) -> str:
        """A time per call in prose, per source item (:func:`fmt_ms`)."""
        return fmt_ms(self.per_item(per_call))

    def ms_each(self, *per_call: Any) -> list[str]:
        """Times per call set side by side in one sentence, per source item, in one unit (:func:`fmt_ms_each`)."""
        return fmt_ms_each(*(self.per_item(x) for x in per_call))

    @property
    def grouped(self) -> bool:
        """Whether one call stands for more (or fewer) source items than one."""
        return self.k != 1.0

    def per_call(self) -> str:
        """The unit said once where a grouped stage's figures could be read per call: ``15.4 items a call``;
        empty for an ungrouped one."""
        return f"{self.k:.3g} items a call" if self.grouped else ""
