"""A run's summary from its saved rows: the pipeline or loader analysis, by the run's kind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stagebench.analysis._loader import summarize_loader
from stagebench.analysis._pipeline import summarize
from stagebench.model._meta import RunMeta
from stagebench.runs._results import RunDir, read_rows_or_empty

__all__ = ["summarize_run", "guess_kind"]


def summarize_run(run_dir: Path) -> dict[str, Any]:
    """Recompute the run's summary from ``results.csv`` and ``run.json`` (kind decides how)."""
    run_dir = Path(run_dir)
    meta = RunDir(run_dir).read_meta()
    rows = read_rows_or_empty(run_dir)
    damaged = list(rows.attrs.get("damaged") or [])
    kind = RunMeta.from_json(meta).kind or guess_kind(rows)
    if kind == "loader":
        summary = summarize_loader(rows, meta)
    elif kind == "pipeline":
        summary = summarize(rows, meta)
    else:
        raise ValueError(f"run.json kind: unknown {kind!r}; allowed: pipeline, loader")
    if damaged:  # said where the figures are read: the summary covers the rows that could be read
        summary["damaged_rows"] = damaged
        summary.setdefault("warnings", []).insert(
            0,
            f"results.csv is damaged: {'; '.join(damaged[:3])}"
            + (f" (and {len(damaged) - 3} more)" if len(damaged) > 3 else ""),
        )
    return summary


def guess_kind(rows: Any) -> str:
    """A run without ``kind`` in its run.json (an old one): loader rows have ``samples_per_s``."""
    return "loader" if "samples_per_s" in rows.columns else "pipeline"
