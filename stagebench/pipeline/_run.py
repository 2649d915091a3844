"""One diagnosis run's shared state: what every phase of a diagnosis reads and writes.

The phases (:mod:`._stages` measures each stage alone, :mod:`._overhead` SPDL's own cost,
:mod:`._rule_out` the process points that could not change the advice, :mod:`._validate` the whole
pipeline, :mod:`._finish` the summary, report and outcome) each take a :class:`Run`: the plan, the
run directory and its ``run.json`` metadata, the settings, the progress display, the seconds spent
per phase, and what went wrong (an analysis bug of ours, a file that could not be written, no memory left).
"""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stagebench.pipeline._settings import DiagnoseSettings
from stagebench.runs._results import read_rows

__all__ = ["Run", "Session"]


@dataclass(eq=False)
class Run:
    """A diagnosis in progress (module docstring)."""

    plan: Any
    run_dir: Any
    settings: DiagnoseSettings
    cache_dir: Path | None
    progress: Any
    meta: dict[str, Any]
    #: seconds per phase of the diagnosis (run.json "phases_s")
    phases: dict[str, float] = field(default_factory=dict)
    #: each stage analysed once, before and after the whole-pipeline runs
    analysis_cache: dict = field(default_factory=dict)
    #: our bug in the analysis or the report: the run says so
    internal_error: str | None = None
    #: a file that could not be written (a full disk): the run says so
    unwritten: str | None = None
    #: this process ran out of memory before the run's end was written (the summary, the report, a phase
    #: cut short): the run ends failed and says so
    out_of_memory: str | None = None

    def say(self, text: str) -> None:
        self.progress.message(text)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Add the block's wall time to ``phases[name]``."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - t0

    def stage_meta(self, name: str) -> dict[str, Any]:
        """The stage's entry in ``run.json["stages"]``."""
        return next(s for s in self.meta["stages"] if s["name"] == name)

    def write_meta(self) -> None:
        self.run_dir.write_meta(self.meta)

    def rows(self) -> Any:
        """The rows measured so far, read back from ``results.csv``."""
        return read_rows(self.run_dir.results_csv)

    def log_error(self, what: str, exc: BaseException) -> None:
        """A traceback of ours, kept in ``error.log`` beside the rows."""
        with open(self.run_dir.path / "error.log", "a", encoding="utf-8") as f:
            f.write(f"--- {what} ---\n{''.join(traceback.format_exception(exc))}\n")


@dataclass(eq=False)
class Session:
    """What a diagnosis leaves for the job phase after it (:mod:`._trainer`), filled as it ends: the
    plan, the source items read once, the recommended settings, what one item at the sink stands for
    in source items, and the run directory."""

    plan: Any = None
    source_items: list = field(default_factory=list)
    choices: dict[str, tuple[str, int]] = field(default_factory=dict)
    """Each stage's recommended (executor, concurrency), by name."""
    items_per_sink_item: float = 1.0
    run_dir: Path | None = None
