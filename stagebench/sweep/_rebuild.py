"""``stagebench report PATH``: rebuild derived files of a run or a sweep folder from saved rows.

Here, beside the sweep app, because a sweep folder is read through
:mod:`stagebench.sweep._multirun`; a plain run needs only the report layer.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from stagebench._errors import StagebenchError
from stagebench.analysis._summary import damaged_text
from stagebench.model._meta import RunMeta
from stagebench.report._compare import write_comparison
from stagebench.report._html import write_text
from stagebench.report._render import load_run, render_report
from stagebench.report._run import FailedJob
from stagebench.runs._jobs import job_label
from stagebench.runs._limits import how_it_ended
from stagebench.runs._results import RunDir, RunFileError, is_run_dir
from stagebench.sweep._multirun import find_run_dirs

__all__ = ["rebuild"]


def _ended(path: Path, say: Callable[[str], None] | None) -> None:
    """A run whose ``run.json`` still says ``running``: how it ended (:func:`stagebench.runs._limits.how_it_ended`),
    found out once and kept in ``run.json["ended"]`` (its cgroup, and so the count, may be gone later), and said."""
    rd = RunDir(path)
    meta = rd.read_meta()
    m = RunMeta.from_json(meta)
    if m.status != "running":
        return
    if m.ended is None or m.ended.by is None:  # an end that showed nothing is looked at again
        ended = how_it_ended(m.provenance.limits if m.provenance is not None else None)
        rd.write_meta({**meta, "ended": ended.to_json()})
    else:
        ended = m.ended
    if say is not None:
        say(f"{path}: the run did not finish: {ended.text}")


def rebuild(path: Path, say: Callable[[str], None] | None = None) -> Path:
    """Rebuild derived files from saved rows, measuring nothing.

    A run directory: recompute ``summary.json`` from ``results.csv`` + ``run.json``
    and rewrite ``report.html`` (returns its path); a run that never finished (``run.json`` still says
    ``running``) gets how it ended (:func:`_ended`), said through ``say``. A sweep directory: rebuild
    the report of every finished job, then the comparison over them (returns
    ``comparison.html``); jobs that failed, did not finish or never started are
    listed as failed (see :func:`find_run_dirs`).
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(2, "no such directory", str(path))
    if is_run_dir(path):
        _ended(path, say)
        run = load_run(path, recompute=True)
        out = path / "report.html"
        write_text(out, render_report(run))
        damaged = run.summary.to_json().get("damaged_rows") or []
        if damaged:  # rebuilt from the rows that could be read; the rest named, and the command says so
            raise RunFileError(
                f"{path / 'results.csv'}: damaged: {damaged_text(damaged)}; "
                f"summary.json and {out.name} were rebuilt from the other rows and say so"
            )
        return out
    runs, failed = find_run_dirs(path)
    if not runs and not failed:
        raise StagebenchError(
            f"{path} is neither a run directory (run.json, results.csv) "
            "nor a sweep directory with run directories inside"
        )
    good: list[Path] = []
    for r in runs:
        try:
            run = load_run(r, recompute=True)
            if run.rows.empty:
                raise ValueError("results.csv has no rows")
            write_text(r / "report.html", render_report(run))
            good.append(r)
        except Exception as e:  # one broken job must not lose the others
            failed.append(
                FailedJob(job_label(r, RunDir(r).read_meta().get("label")), f"{type(e).__name__}: {e}", str(r))
            )

    return write_comparison(good, path, title=f"sweep {path.name}", failed=failed)
