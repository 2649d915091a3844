"""A run's summary from its saved rows: the pipeline or loader analysis, by the run's kind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stagebench.runs._results import RunDir, read_rows_or_empty

__all__ = ["summarize_run", "guess_kind"]


def summarize_run(run_dir: Path) -> dict[str, Any]:
    """Recompute the run's summary from ``results.csv`` and ``run.json`` (kind decides how)."""
    run_dir = Path(run_dir)
    meta = RunDir(run_dir).read_meta()
    rows = read_rows_or_empty(run_dir)
    kind = meta.get("kind") or guess_kind(rows)
    if kind == "loader":
        from stagebench.analysis._loader import summarize_loader

        return summarize_loader(rows, meta)
    if kind == "pipeline":
        from stagebench.analysis._pipeline import summarize

        return summarize(rows, meta)
    raise ValueError(f"run.json kind: unknown {kind!r}; allowed: pipeline, loader")


def guess_kind(rows: Any) -> str:
    """A run without ``kind`` in its run.json (an old one): loader rows have ``samples_per_s``."""
    return "loader" if "samples_per_s" in rows.columns else "pipeline"
