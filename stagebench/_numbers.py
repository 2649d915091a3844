"""Numbers as the rows and summaries hold them: one test for "a finite number", one way to write one.

Rows come back from CSV and JSON as floats, numpy scalars, None or NaN; every
layer asks the same questions of them, so they are answered once, here.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["finite", "num", "num_or_none", "fmt_q", "fmt_ms", "fmt_share_of", "fmt_above"]


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


def fmt_ms(s: float) -> str:
    """A duration in prose: ``4.56 ms``; from a second up, in seconds (``1.15 s``, not ``1.15e+03 ms``)."""
    return f"{s:.3g} s" if s >= 1 else f"{s * 1e3:.3g} ms"


def fmt_share_of(share: float) -> str:
    """``"93% of"`` for a rate against its no-op ceiling, or ``"at"`` above it (``fmt_above`` says why)."""
    return f"{share:.0%} of" if share <= 1 else "at"


def fmt_above(share: float) -> str:
    """A rate read above its no-op ceiling is noise between two points measured apart: said, not shown as a share."""
    if share <= 1:
        return ""
    return f"; it read {share - 1:.0%} above it, which only the noise between two points measured apart can do"
