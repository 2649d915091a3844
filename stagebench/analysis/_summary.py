"""A run's summary from its saved rows, by the run's kind: the analysis's part of each kind
(:class:`stagebench.analysis._kind.KindAnalysis`), which :mod:`stagebench.report._kinds` completes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stagebench.analysis import _loader_job, _pipeline, _pipeline_job
from stagebench.analysis._kind import KindAnalysis
from stagebench.analysis._loader import summarize_loader
from stagebench.model._meta import RunMeta
from stagebench.runs._results import RunDir, read_rows_or_empty

__all__ = ["summarize_run", "guess_kind", "damaged_text", "LoaderAnalysis", "PipelineAnalysis", "analysis_of"]


class LoaderAnalysis:
    """A DataLoader's sweep: :mod:`stagebench.analysis._loader` summarises it, :mod:`._loader_job` offers
    its job candidates and makes their pick the recommended point."""

    name = "loader"
    summarize = staticmethod(summarize_loader)
    job_candidates = staticmethod(_loader_job.job_candidates)
    apply_job_pick = staticmethod(_loader_job.apply_job_pick)


class PipelineAnalysis:
    """An SPDL pipeline's diagnosis: :mod:`stagebench.analysis._pipeline` summarises it and offers its job
    candidates, :mod:`._pipeline_job` makes their pick every stage's recommendation."""

    name = "pipeline"
    summarize = staticmethod(_pipeline.summarize)
    job_candidates = staticmethod(_pipeline.job_candidates_of_run)
    apply_job_pick = staticmethod(_pipeline_job.apply_job_pick)


_ANALYSES: dict[str, KindAnalysis[Any, Any]] = {k.name: k for k in (LoaderAnalysis(), PipelineAnalysis())}


def analysis_of(kind: str) -> KindAnalysis[Any, Any]:
    """The analysis of the kind named ``kind`` (``run.json["kind"]``); a ValueError for another name."""
    if kind not in _ANALYSES:
        raise ValueError(f"run.json kind: unknown {kind!r}; allowed: pipeline, loader")
    return _ANALYSES[kind]


def summarize_run(run_dir: Path) -> dict[str, Any]:
    """The summary of the run in ``run_dir``, recomputed from its ``results.csv`` and ``run.json`` by the
    analysis of its kind; returns it (not written). Damaged rows are named in its first warning."""
    run_dir = Path(run_dir)
    meta = RunDir(run_dir).read_meta()
    rows = read_rows_or_empty(run_dir)
    damaged = list(rows.attrs.get("damaged") or [])
    summary = analysis_of(RunMeta.from_json(meta).kind or guess_kind(rows)).summarize(rows, meta)
    if damaged:  # said where the figures are read: the summary covers the rows that could be read
        summary["damaged_rows"] = damaged
        summary.setdefault("warnings", []).insert(0, f"results.csv is damaged: {damaged_text(damaged)}")
    return summary


def damaged_text(damaged: list[str]) -> str:
    """The first three of ``results.csv``'s ``damaged`` rows (each a place and why), and how many more."""
    return "; ".join(damaged[:3]) + (f" (and {len(damaged) - 3} more)" if len(damaged) > 3 else "")


def guess_kind(rows: Any) -> str:
    """A run without ``kind`` in its run.json (an old one): loader rows have ``samples_per_s``."""
    return "loader" if "samples_per_s" in rows.columns else "pipeline"
