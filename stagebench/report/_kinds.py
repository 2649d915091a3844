"""The two kinds of run whole (:class:`stagebench.analysis._kind.RunKind`): the analysis's part of each
(:mod:`stagebench.analysis._summary`) with the table a run ends with and the report's page.

Here, in the report, because a kind's page and table are; the pages draw with matplotlib, so what
only prints a table (the end of a run) imports :mod:`stagebench.report._terminal` instead.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from stagebench.analysis._kind import RunKind
from stagebench.analysis._summary import LoaderAnalysis, PipelineAnalysis
from stagebench.report._loader_page import loader_context
from stagebench.report._pipeline_page import pipeline_context
from stagebench.report._run import RunData
from stagebench.report._terminal import format_loader_table, format_table, job_lines

__all__ = ["LOADER", "PIPELINE", "KINDS", "kind_of"]


class _Loader(LoaderAnalysis):
    """A DataLoader's sweep: its points' table, then the job runs', and the loader's page."""

    page_context = staticmethod(loader_context)

    def title(self, run: RunData) -> str:
        """The loader's name and backend."""
        info = run.loader
        return f"{'loader' if info.name is None else info.name} ({'?' if info.backend is None else info.backend})"

    def table(self, summary: Mapping[str, Any], report_path: str | os.PathLike[str] | None = None) -> str:
        """The points' table, then the job runs' lines after a line break of their own, the report's path
        where given."""
        report = "" if report_path is None else f"report: {os.fspath(report_path)}\n"
        return format_loader_table(summary) + "\n" + "\n".join(job_lines(summary)) + "\n" + report


class _Pipeline(PipelineAnalysis):
    """An SPDL pipeline's diagnosis: its stages' table (with the job runs') and the pipeline's page."""

    page_context = staticmethod(pipeline_context)
    table = staticmethod(format_table)

    def title(self, run: RunData) -> str:
        """The pipeline's first six stages, or its bottleneck where none is named."""
        names = [s.name for s in run.stages] or [str(s.get("name")) for s in run.meta.stages]
        if names:
            return f"pipeline: {' → '.join(names[:6])}" + (" → …" if len(names) > 6 else "")
        return f"pipeline {run.summary.prediction.bottleneck or ''}".strip()


LOADER: RunKind[Any, Any, RunData] = _Loader()
PIPELINE: RunKind[Any, Any, RunData] = _Pipeline()
#: Each kind by its name, ``run.json["kind"]``.
KINDS: dict[str, RunKind[Any, Any, RunData]] = {k.name: k for k in (LOADER, PIPELINE)}


def kind_of(name: str | None) -> RunKind[Any, Any, RunData]:
    """The kind named ``name`` (``run.json["kind"]``, ``summary.json["kind"]``); the pipeline for a name it
    does not know, as the report draws a run whose kind is not recorded."""
    return KINDS.get(name or "", PIPELINE)
