"""The per-run HTML report: one self-contained file, rebuilt from saved rows.

Why it is built this way:

* A pure function of the run directory. ``results.csv`` and ``run.json`` are
  the source of truth; ``summary.json`` is derived from them (``rebuild``
  recomputes it) and the HTML is derived from all three. Nothing in the page
  depends on the clock, the host or hash seeds, so the same rows give the same
  bytes and a report can be diffed, cached and committed.
* Self-contained and offline: figures are SVG embedded as ``data:`` images
  (an image cannot run script, and separate documents cannot clash on ids),
  the CSV download is a ``data:`` link, and there is no JavaScript at all, so
  there is nothing to fail in a browser console and nothing to fetch.
* Every user-given string (stage names, reasons, labels) reaches the page only
  through jinja2 with autoescape, or through :func:`json_island`, which escapes
  ``<``, ``>`` and ``&`` so that no string can close the ``<script>`` element
  that carries the machine-readable rows.
* Analysis lives elsewhere (``analysis/_summary.summarize_run``); this module
  loads a run and presents it, with the page of its kind (``_pipeline_page``
  or ``_loader_page``).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stagebench._numbers import finite
from stagebench.analysis._summary import guess_kind, summarize_run
from stagebench.model._meta import RunMeta
from stagebench.model._summary import Summary
from stagebench.report._html import (
    csv_uri,
    json_island,
    provenance_items,
    render,
    rows_records,
    write_text,
)
from stagebench.report._run import RunData, stored_summary
from stagebench.runs._results import TRANSFORMS_CSV, RunDir, is_run_dir, read_rows, read_rows_or_empty, to_jsonable

__all__ = [
    "write_report",
    "summarize_run",
    "render_report",
    "load_run",
    "RunData",
    "json_island",
]


def load_run(run_dir: Path, *, recompute: bool = False) -> RunData:
    """Read a run directory; compute the summary when it is missing (or when asked).

    A summary that cannot be computed does not stop the report: the page shows
    the rows and plots, and the error, rather than nothing at all.
    """
    run_dir = Path(run_dir)
    if not is_run_dir(run_dir):
        raise FileNotFoundError(2, "not a run directory (no run.json or results.csv)", str(run_dir))
    rd = RunDir(run_dir)
    meta = RunMeta.from_json(rd.read_meta())
    rows = read_rows_or_empty(run_dir)
    summary = stored_summary(rd.summary_json) if not recompute and rd.summary_json.is_file() else {}
    error = None
    if not summary:
        try:
            summary = to_jsonable(summarize_run(run_dir))
            rd.write_summary(summary)
        except Exception as e:
            if recompute:
                raise
            error = f"{type(e).__name__}: {e}"
    tpath = run_dir / TRANSFORMS_CSV
    return RunData(
        run_dir,
        meta,
        rows,
        Summary.from_json(summary),
        summary_error=error,
        csv_bytes=rd.results_csv.read_bytes() if rd.results_csv.is_file() else b"",
        kind=meta.kind or guess_kind(rows),
        # a loader's transforms, measured as pipeline stages (STAGE_COLUMNS rows)
        transform_rows=read_rows(tpath) if tpath.is_file() and tpath.stat().st_size > 0 else None,
    )


#: Per-stage summary entries left out of the page's JSON copy: each is drawn or listed above it, or
#: derived from the rows of the CSV download; ``summary.json`` beside the report keeps them all.
_NOT_IN_PAGE = ("curves", "fit", "evidence")


def page_summary(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The summary as the page embeds it: without what the page shows or the CSV holds (_NOT_IN_PAGE).

    The rows are embedded once, as the CSV download: a JSON copy of them too would add a tenth to a report.
    """
    out = dict(summary)
    if isinstance(out.get("stages"), list):
        out["stages"] = [
            {k: v for k, v in st.items() if k not in _NOT_IN_PAGE} if isinstance(st, Mapping) else st
            for st in out["stages"]
        ]
    return out


def _phases_text(phases: Any) -> str | None:
    """Where the diagnosis spent its time, largest first: ``stage points 120 s (61%), ...``."""
    if not isinstance(phases, Mapping) or not finite(phases.get("total")) or not float(phases["total"]) > 0:
        return None
    total = float(phases["total"])
    parts = sorted(
        ((k, float(v)) for k, v in phases.items() if k != "total" and finite(v) and v > 0), key=lambda x: -x[1]
    )
    return f"{total:.0f} s: " + ", ".join(f"{k.replace('_', ' ')} {v:.0f} s ({v / total:.0%})" for k, v in parts)


def report_context(run: RunData) -> dict[str, Any]:
    # the pages draw with matplotlib, imported here, inside write_report: its callers catch an import short of memory
    from stagebench.report import _kinds, _page_parts

    sm, meta, kind = run.summary, run.meta, _kinds.kind_of(run.kind)
    warnings = list(sm.warnings)
    if run.summary_error:
        warnings.insert(
            0, f"the analysis could not run, so this report shows the raw measurements only ({run.summary_error})"
        )
    if run.rows.empty:
        warnings.insert(0, "no measured rows: results.csv is missing or empty")
    settings = run.settings.to_json()
    findings = sm.findings
    # Findings arrive ranked: show the important ones, fold the minor tail away.
    split = max(3, sum(1 for f in findings if f.severity in ("high", "medium")))
    ctx: dict[str, Any] = {
        "kind": run.kind,
        "title": kind.title(run),
        "verdict": sm.verdict
        or ("no verdict: the analysis did not run" if run.summary_error else "no verdict in summary.json"),
        "demand": sm.demand.text,
        "scope": sm.scope,
        # with the job run, the comparison with yours is the job's (its section); the pipeline alone's
        # "keep them" next to a job pick that changes them would be two recommendations
        "yours": None if run.job is not None and run.job.decided else sm.recommended_vs_yours.text,
        "warnings": warnings,
        "findings": findings[:split],
        "more_findings": findings[split:],
        "provenance": provenance_items(run.provenance, meta.provenance_after),
        "run_items": [
            (k, str(v))
            for k, v in (
                ("created", meta.created_at),
                ("command", _command(meta)),
                ("stagebench", sm.stagebench_version),
                ("run directory", run.path.name),
                ("time spent", _phases_text(meta.phases_s)),
            )
            if v
        ],
        "settings": [
            (str(k), json.dumps(to_jsonable(v), ensure_ascii=False, default=str)) for k, v in settings.items()
        ],
        "summary_json": json_island(page_summary(sm.to_json())),
        "csv_uri": csv_uri(run.csv_bytes),
        "n_rows": len(run.rows),
        "columns": list(run.rows.columns),
    }
    ctx["job"] = _page_parts.job_context(run.job)
    trows = run.transform_rows
    ctx["transform_rows_json"] = json_island(rows_records(trows)) if trows is not None else None
    ctx.update(dict.fromkeys(_kinds.KINDS))  # the other kind's page is None
    ctx[kind.name] = kind.page_context(run)
    return ctx


def _command(m: RunMeta) -> str | None:
    cmd = m.command
    if isinstance(cmd, (list, tuple)):
        return shlex.join(str(c) for c in cmd)
    return cmd


def render_report(run: RunData) -> str:
    """The report HTML for a loaded run (pure: same run data, same text)."""
    return render("report.html.j2", **report_context(run))


# --------------------------------------------------------------------------- entry points


def write_report(run_dir: Path) -> Path:
    """Write ``report.html`` for a run directory (computing ``summary.json`` if missing)."""
    run = load_run(Path(run_dir))
    out = run.path / "report.html"
    write_text(out, render_report(run))
    return out
