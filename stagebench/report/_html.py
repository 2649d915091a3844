"""What the HTML pages share: the jinja2 environment, value formatting, and safe embedding.

Every user-given string reaches a page only through jinja2 with autoescape or
through :func:`json_island`; figures and the CSV download are ``data:`` URIs,
so a page is one self-contained file with no script to run.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pandas as pd

from stagebench._numbers import finite, num
from stagebench.model._meta import Provenance
from stagebench.runs._results import to_jsonable, write_atomically


@functools.cache
def _env():
    # jinja2 and markupsafe load with the first page, inside write_report: its callers catch an import short of memory
    from jinja2 import Environment, PackageLoader, StrictUndefined

    env = Environment(
        loader=PackageLoader("stagebench.report", "templates"),
        autoescape=True,
        undefined=StrictUndefined,  # a missing context key is a bug in this module, not an empty cell
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(rate=rate_text, num=num_text, pct=pct_text, interval=interval_text)
    return env


def render(template: str, **ctx: Any) -> str:
    return _env().get_template(template).render(**ctx)


def _scaled(v: float, spec: str) -> str:
    """``v`` formatted with ``spec``, in thousands (k) or millions (M) from 1,000 and 1,000,000."""
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:{spec}}M"
    if a >= 1e3:
        return f"{v / 1e3:{spec}}k"
    return f"{v:{spec}}"


def si_label(v: float, _pos: Any = None) -> str:
    """Tick labels: 1.2k, 35k, 2M."""
    return _scaled(v, "g")


def rate_text(x: Any) -> str:
    """A rate with three significant digits: 482, 3.81k, 1.16M; ``n/a`` where it is no finite number."""
    return _scaled(float(x), ".3g") if finite(x) else "n/a"


def num_text(x: Any, digits: int = 3) -> str:
    if isinstance(x, bool) or x is None:
        return "—" if x is None else str(x).lower()
    if isinstance(x, int):
        return f"{x:,}"
    if not finite(x):
        return "—"
    x = float(x)
    if x == 0:
        return "0"
    if abs(x) >= 10**digits:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def pct_text(x: Any, signed: bool = False) -> str:
    if not finite(x):
        return "—"
    return f"{float(x) * 100:+.0f}%" if signed else f"{float(x) * 100:.0f}%"


def interval_text(lo: Any, hi: Any) -> str:
    if not (finite(lo) and finite(hi)):
        return "no interval"
    return f"{rate_text(lo)}–{rate_text(hi)}"


def json_island(obj: Any) -> Any:
    """JSON that is safe inside ``<script type="application/json">``.

    Escaping ``<`` ``>`` ``&`` as ``\\u003c`` etc. keeps the JSON identical
    after parsing while making ``</script>`` (or ``<!--``) impossible inside
    the element; U+2028/9 are escaped for old JavaScript parsers.
    """
    from markupsafe import Markup  # as jinja2 in _env: with the first page

    text = json.dumps(
        _significant(to_jsonable(obj)), ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=str
    )
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(ch, esc)
    return Markup(text)


def _significant(x: Any) -> Any:
    """Floats to 7 significant digits: the page's copy of the numbers (the run's files keep them all).

    A measured rate carries 2-3 meaningful digits; seventeen would double a report's embedded data.
    """
    if isinstance(x, float):
        return float(f"{x:.7g}")
    if isinstance(x, dict):
        return {k: _significant(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_significant(v) for v in x]
    return x


def svg_uri(svg: str | None) -> Any:
    """A data URI of the SVG for an ``<img src="...">``, percent-encoded: smaller than base64.

    Everything that could end or confuse a double-quoted attribute (``"``, ``&``) or the
    URI (``%``, ``#``, controls, non-ASCII) is percent-encoded; ``<`` and ``>`` stay as they
    are, which a quoted attribute value allows, so the result is marked safe for the template.
    """
    from markupsafe import Markup  # as jinja2 in _env: with the first page

    if not svg:
        return None
    return Markup("data:image/svg+xml;charset=utf-8," + quote(svg, safe=" /=:;,.-_()'!*+@~<>"))


def csv_uri(data: bytes) -> str:
    """A data URI of the CSV for a download link, percent-encoded (commas and digits stay as they are)."""
    return "data:text/csv;charset=utf-8," + quote(data, safe=" ,.-_:;/()=!*+@~")


def rows_records(rows: pd.DataFrame) -> list[dict[str, Any]]:
    return to_jsonable(rows.astype(object).where(rows.notna(), None).to_dict("records"))


def provenance_items(p: Provenance, end: Provenance | None = None) -> list[tuple[str, str]]:
    """The machine a run was measured on, as the report's (label, text) lines.

    Args: the provenance at the run's start, and at its end (its load average; None where not recorded).
    Returns: the lines, those the run did not record left out.
    """
    items: list[tuple[str, str]] = []

    def add(label: str, value: Any) -> None:
        if value not in (None, "", [], {}):
            items.append((label, str(value)))

    add("host", p.hostname)
    add("CPU", p.cpu_model)
    lim = p.limits
    if p.cpu_count is not None:
        add(
            "cores",
            f"{p.cpu_count if p.usable_cores is None else p.usable_cores} usable of {p.cpu_count}"
            + ("" if lim is None else f" ({lim.cores_origin()})"),
        )
    r = p.ranks
    if r.ranked:  # the host's ranks measured together: every figure of the report is the host's
        hosts = f" on {r.nodes} hosts ({r.world_size} ranks in all; this is host {r.node})" if r.nodes > 1 else ""
        add(
            "ranks",
            f"{r.local_world_size} on this host{hosts}, each its own loader or pipeline, measured together"
            f"{'' if r.launcher is None else f', started by {r.launcher}'}: rates are the host's, the sum over "
            "its ranks",
        )
    if p.memory_total_gb is not None:
        add("memory", f"{p.memory_total_gb} GB total, {p.memory_available_gb} GB available at start")
    if lim is not None and lim.memory_limit is not None:
        m = lim.memory_limit
        add(
            "memory limit",
            f"{m.limit_mb:,.0f} MB ({m.file} of cgroup {m.group}), {m.used_mb:,.0f} MB used at start"
            + (f": {lim.memory_mb:,.0f} MB for the job" if lim.memory_mb is not None else ""),
        )
    if lim is not None and lim.shm_total_mb is not None:
        add("/dev/shm", f"{lim.shm_total_mb:,.0f} MB, {num(lim.shm_free_mb):,.0f} MB free at start")
    if p.python:
        add(
            "Python",
            f"{p.python} ({'' if p.python_implementation is None else p.python_implementation}"
            f"{', free-threaded' if p.free_threaded else ', with the GIL'})",
        )
    add("platform", p.platform)
    if p.load_avg:
        txt = "start " + " / ".join(f"{v:.2f}" for v in p.load_avg)
        if end is not None and end.load_avg:
            txt += ", end " + " / ".join(f"{v:.2f}" for v in end.load_avg)
        add("load average (1/5/15 min)", txt)
    add("libraries", ", ".join(f"{k} {v}" for k, v in p.libraries.items() if v))
    add("environment", ", ".join(f"{k}={v}" for k, v in p.env.items()))
    add("taken at", p.taken_at)
    return items


def machine_label(p: Provenance) -> str:
    """``host · CPU · N cores``: a run's machine in one label."""
    parts = [str(p.hostname or "?")]
    if p.cpu_model:
        parts.append(str(p.cpu_model))
    if p.cores:
        parts.append(f"{p.cores} cores")
    return " · ".join(parts)


def write_text(path: Path, text: str) -> None:
    """A page written atomically (:func:`stagebench.runs._results.write_atomically`): a browser refreshing
    mid-write never sees half of it, and a failed write leaves no temporary file."""
    write_atomically(path, text)
