"""What the pipeline and loader pages share: table cells, the failed points, the noise tile, and
the training job's tile and section.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from stagebench._numbers import finite
from stagebench.analysis._job import ORIGIN_WORDS
from stagebench.model._job import JobFigures, JobVerdict
from stagebench.report import _compare_plots
from stagebench.report._html import interval_text, pct_text, rate_text, svg_uri

__all__ = ["cell", "problem_rows", "noise_tile", "to_ms", "with_keys", "job_tile", "job_context"]

#: where a point ran, as a failed points' table shows it (the columns the rows have)
_WHERE = ("role", "harness", "executor", "concurrency", "num_workers", "prefetch_factor", "persistent_workers")


def problem_rows(rows: pd.DataFrame) -> list[dict[str, Any]]:
    """The points that did not measure, as a table: where they ran, their status and why.

    Args: the rows (a stage's, or a loader's). Returns: one dict of cells per row whose status is not ok,
    the columns the rows have among the setting, status and reason.
    """
    if rows.empty or "status" not in rows:
        return []
    bad = rows[rows["status"].astype(str) != "ok"]
    cols = [c for c in (*_WHERE, "status", "reason", "error_example") if c in bad.columns]
    return [{k: cell(v) for k, v in r.items()} for r in bad[cols].to_dict("records")]


def cell(v: Any) -> Any:
    """A table cell: blanks for missing values, integral floats as integers (CSV reads 2 as 2.0)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, (bool,)) or str(v) in ("True", "False"):
        return "yes" if str(v) == "True" else "no"
    if v == "not applicable":
        return "n/a"
    return v


def noise_tile(rows: pd.DataFrame, value: str) -> dict[str, str] | None:
    """The median relative half-width of the intervals measured for ``value`` (its ``_low`` and
    ``_high`` columns), as a tile: a fact of the rows, not an analysis. None without intervals."""
    if rows.empty or value not in rows:
        return None
    ok = rows[(rows["status"] == "ok")]
    if "role" in ok:
        ok = ok[ok["role"] == "stage"]
    v, lo, hi = (pd.to_numeric(ok[c], errors="coerce") for c in (value, f"{value}_low", f"{value}_high"))
    rel = ((hi - lo) / 2 / v).replace([math.inf, -math.inf], math.nan).dropna()
    if not len(rel):
        return None
    return tile("measurement noise", f"±{float(rel.median()) * 100:.1f}%", "median half-width of the 95% intervals")


def tile(label: str, value: str, sub: str) -> dict[str, str]:
    """A tile of a page's head: what it is, its figure, and a line under it."""
    return {"label": label, "value": value, "sub": sub}


def with_keys(d: Mapping[str, Any] | None, keys: Sequence[str]) -> dict[str, Any]:
    """A summary dict with every key the template reads (None when absent), extra keys kept."""
    return {**dict.fromkeys(keys), **(d or {})}


def to_ms(x: Any) -> float | None:
    """Seconds as milliseconds, for a table cell."""
    return float(x) * 1e3 if finite(x) else None


def job_tile(job: JobVerdict | None) -> list[dict[str, str]]:
    """The first tile where the job ran: what your loop did at the recommended setting."""
    if job is None or not job.decided or not finite(job.samples_per_s):
        return []
    return [
        tile(
            "your training job, recommended",
            f"{rate_text(job.samples_per_s)} {job.unit or 'samples/s'}",
            f"{interval_text(job.samples_per_s_low, job.samples_per_s_high)} · "
            f"{pct_text(job.data_wait_share)} of each step waiting for data",
        )
    ]


def job_context(job: JobVerdict | None) -> dict[str, Any] | None:
    """The training job's section: your loop on the real loader or pipeline at each candidate (summary["job"])."""
    if job is None:
        return None
    rows = []
    for c in job.candidates:
        f = c.job or JobFigures()
        rows.append(
            {
                "label": str(c.name),
                "why": ", ".join(ORIGIN_WORDS.get(o, str(o)) for o in c.origin),
                "rate": f.samples_per_s,
                "low": f.samples_per_s_low,
                "high": f.samples_per_s_high,
                "wait": f.data_wait_share,
                "alone": c.alone.value if c.alone is not None else None,
                "slices": f.slices,
                "steps": f.steps,
                "startup": f.startup_s,
                "pick": c.key == job.pick,
                "as_good": c.as_good,
                "versus": "yours"
                if c.key == job.yours
                else (c.versus_yours.detail() if c.versus_yours is not None else "—"),
            }
        )
    return {
        "text": str(job.text or ""),
        "why": str(job.why or ""),
        "unit": str(job.unit or "samples/s"),
        "img": svg_uri(_compare_plots.job_svg(job)),
        "rows": rows,
        "zero_workers": job.zero_workers,
        "unproven": [str(u) for u in job.unproven],
        "rounds": job.rounds,
        "seconds": job.seconds,
        "demand": job.demand,
    }
