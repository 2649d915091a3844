"""The end of a diagnosis: the summary of the rows, the report, and the run's outcome.

An analysis or report bug of ours never costs the rows: the run keeps a minimal summary and report
(:func:`fallback_summary`, :func:`fallback_report`), ends ``internal error`` and keeps the traceback
in ``error.log``. The same minimal files where this process has no memory left for ours (a stage kept
what it allocated): that is no bug of ours, and the run ends ``failed``, saying so. A pipeline that
delivers nothing is a failed run, whatever its stages measured (:func:`delivered_nothing`). The
outcomes and their exit codes: :mod:`stagebench.runs._outcome`.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from stagebench._memory import out_of_memory, said_out_of_memory
from stagebench._numbers import num
from stagebench._version import __version__
from stagebench.model._pipeline import WholeRun
from stagebench.model._stage import StageEntry, StageEvidence, StageSetting, changed, keyed
from stagebench.model._summary import Summary
from stagebench.pipeline._run import Run
from stagebench.report._terminal import format_table
from stagebench.runs._outcome import COMPLETE, FAILED, INTERNAL, PARTIAL
from stagebench.runs._schema import SUMMARY_SCHEMA_VERSION

__all__ = [
    "summarize_run",
    "write_run_report",
    "status_of",
    "report_what_was_kept",
    "delivered_nothing",
    "phases_of",
    "fallback_summary",
    "fallback_report",
]


def summarize_run(run: Run, rows: Any) -> dict[str, Any]:
    """The summary of the rows; where the analysis raises (our bug), a minimal one, and the run says so."""
    # pandas with it: loaded when the rows are analysed, not in the process while it measures
    from stagebench.analysis._pipeline import summarize

    try:
        return summarize(rows, run.meta, stage_cache=run.analysis_cache)
    except Exception as e:  # our bug, on rows a run produced: a minimal summary, and the run says so
        what = out_of_memory(e)
        if what:  # not a bug: what the stage left of this process's memory was not enough for it
            run.out_of_memory = run.out_of_memory or f"the analysis ran out of memory ({what})"
            return fallback_summary(rows, run.meta, run.out_of_memory)
        run.log_error("analysis", e)
        run.internal_error = f"the analysis failed: {type(e).__name__}: {e}"
        return fallback_summary(rows, run.meta, run.internal_error)


def write_run_report(run: Run, summary: dict[str, Any]) -> Path:
    """``report.html``; where the report raises (our bug), a minimal one, and the run says so. A write
    that fails (a full disk) is raised: the caller says it."""
    # pandas with it: loaded when the rows are analysed, not in the process while it measures
    from stagebench.report._render import write_report

    try:
        return Path(write_report(run.run_dir.path))
    except Exception as e:
        what = out_of_memory(e)
        if what:  # not a bug, nor a full disk: the report's imports and figures found no memory left
            run.out_of_memory = run.out_of_memory or f"the report ran out of memory ({what})"
            return fallback_report(run.run_dir.path, summary)
        if isinstance(e, OSError):
            raise
        run.log_error("report", e)
        run.internal_error = run.internal_error or f"the report failed: {type(e).__name__}: {e}"
        return fallback_report(run.run_dir.path, summary)


def status_of(run: Run, summary: Summary) -> str:
    """run.json's status at the end (:mod:`stagebench.runs._outcome`): the first of failed (the pipeline
    delivers nothing, or this process ran out of memory for the summary or the report), internal error,
    partial that holds, else complete."""
    if summary.validation_failed or run.out_of_memory:
        return str(FAILED.status)
    if run.internal_error:
        return str(INTERNAL.status)
    if run.unwritten:
        return str(PARTIAL.status)
    return str(COMPLETE.status)


def report_what_was_kept(run: Run, write_report: bool) -> None:
    """After Ctrl-C or SIGTERM: the summary and report of the rows measured so far, where there are any.

    A second Ctrl-C stops this too; nothing here may hide the interrupt itself."""
    try:
        rows = run.rows()
        if not len(rows):
            return
        summary = summarize_run(run, rows)
        run.run_dir.write_summary(summary)
        if write_report:
            write_run_report(run, summary)
    except (Exception, KeyboardInterrupt):
        return


def phases_of(timed: dict[str, float], rows: Any, total: float) -> dict[str, float]:
    """Seconds per phase: the timed blocks, the points by role (their rows' own ``elapsed_s``), the rest.

    Stage points, no-op ceilings and head-to-head rounds run interleaved, stage by stage, so they
    are added up from the rows rather than timed as blocks; ``other`` is what remains of ``total``
    (starting pools, the GIL speed probe, writing rows, waiting between points).
    """
    out = {k: round(v, 2) for k, v in timed.items()}
    if len(rows) and "role" in rows and "elapsed_s" in rows:
        by_role = rows.groupby("role")["elapsed_s"].sum()
        names = {"stage": "stage_points", "ceiling": "ceilings", "paired": "head_to_head"}
        for role, seconds in by_role.items():
            out[names.get(str(role), f"{role}_points")] = round(float(seconds), 2)
    out["other"] = round(max(0.0, total - sum(out.values())), 2)
    out["total"] = round(total, 2)
    return out


def delivered_nothing(validation: WholeRun) -> str | None:
    """Why the real pipeline's run is a failed validation, or None: it must deliver items to the sink.

    A prediction next to a pipeline that delivers nothing is not a result: the run ends with exit code 1.
    One that drew items from its source but was slower than the window is working: no number, no failure;
    one that ran out of memory is not.
    """
    what = said_out_of_memory(validation.error or "")
    if what:
        return f"the real pipeline ran out of memory ({what})"
    if validation.source_items:
        return None
    if validation.qps is None:
        return f"the real pipeline delivered no measurable throughput ({validation.error or 'no items'})"
    if not validation.sink_items:
        return f"the real pipeline delivered no items to the sink in {num(validation.seconds):.1f} s"
    return None


def fallback_summary(rows: Any, meta: dict[str, Any], why: str) -> dict[str, Any]:
    """FALLBACK, used only when the analysis raised (a bug of ours): the rows must still be reported.

    Honest and minimal: per stage the best measured point, classification
    ``unknown``, and no recommendation: recommending is the analysis's rule
    (:func:`stagebench.analysis._pipeline.summarize`), not one to keep a second
    copy of here. No GIL estimate, no prediction. ``why`` is kept in ``summary["error"]``.
    """
    stages = []
    for st in meta.get("stages", []):
        d = rows[(rows["stage"] == st["name"]) & (rows["role"] == "stage")] if len(rows) else rows
        ok = d[(d["status"] == "ok") & d["qps"].notna()] if len(d) else d
        best = ok.loc[ok["qps"].idxmax()] if len(ok) else None
        entry = changed(
            StageEntry.empty(st["name"]),
            index=st["index"],
            type=st["type"],
            status="ok" if len(ok) else (str(d["status"].iloc[0]) if len(d) else "not_measured"),
            evidence=keyed(StageEvidence, summary=(f"{why}: minimal summary",), signals={}),
            best=None
            if best is None
            else keyed(
                StageSetting,
                executor=best["executor"],
                concurrency=int(best["concurrency"]),
                qps=float(best["qps"]),
                qps_low=best["qps_low"],
                qps_high=best["qps_high"],
                harness=best["harness"],
            ),
        )
        stages.append(entry.to_json())
    return {
        "schema_version": SUMMARY_SCHEMA_VERSION,
        "kind": "pipeline",
        "stagebench_version": __version__,
        "provenance": meta.get("provenance"),
        "settings": meta.get("settings"),
        "verdict": f"minimal summary ({why}): the best measured point of each stage, no recommendation",
        "warnings": [f"{why}: classification, GIL fraction and prediction were not computed"],
        "stages": stages,
        "not_isolated": meta.get("not_isolated", []),
        "prediction": None,
        "validation": meta.get("validation"),
        "findings": [],
        "fallback": True,
        "error": why,
    }


def fallback_report(run_dir: Path, summary: dict[str, Any]) -> Path:
    """FALLBACK, used only while ``stagebench.report._render`` is unavailable: a plain, escaped table."""
    body = html.escape(format_table(summary))
    data = html.escape(json.dumps(summary, indent=2, default=str))
    path = run_dir / "report.html"
    path.write_text(
        "<!doctype html><meta charset='utf-8'><title>stagebench diagnosis</title>"
        "<h1>stagebench diagnosis (minimal report)</h1>"
        f"<pre>{body}</pre><details><summary>summary.json</summary><pre>{data}</pre></details>\n",
        encoding="utf-8",
    )
    return path
