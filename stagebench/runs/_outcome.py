"""How a run ended: one table of outcomes, each with its exit code and its ``run.json`` status.

Why one table: a CI job, a scheduler and a user reading the terminal all ask "did it work?", and each
reads a different signal (the exit code, ``run.json["status"]``, the last line). A run that failed
must not exit 0, an internal error must not read as a user's mistake, and a run cut short must say
where what it measured is. ``docs/faults.md`` shows this table; a test keeps the two the same.
"""

from __future__ import annotations

from dataclasses import dataclass

from stagebench._errors import RankLost, Terminated

__all__ = [
    "Outcome",
    "OUTCOMES",
    "outcome",
    "COMPLETE",
    "FAILED",
    "BAD_INPUT",
    "INTERNAL",
    "PARTIAL",
    "INTERRUPTED",
    "TERMINATED",
    "RANK_LOST",
    "interrupted_outcome",
]


@dataclass(frozen=True, slots=True)
class Outcome:
    """One way a run can end."""

    name: str
    exit_code: int
    status: str | None
    """``run.json["status"]``; None where no run directory was made (the input was refused first)."""
    meaning: str
    files: str
    """What is on disk afterwards."""


COMPLETE = Outcome(
    "complete", 0, "complete", "measured, analysed, reported", "run.json, results.csv, summary.json, report.html"
)
FAILED = Outcome(
    "failed",
    1,
    "failed",
    "the target could not be measured: the pipeline delivers nothing, no loader setting ran, or the "
    "diagnosing process ran out of memory (a stage that keeps what it allocates, a memory limit)",
    "run.json (its error says why), results.csv (the failures and their reasons), summary.json, report.html",
)
BAD_INPUT = Outcome(
    "bad input",
    2,
    None,
    "a setting, a path, an output folder or a damaged run file refused before any work",
    "nothing new (a damaged file is left as it was)",
)
INTERNAL = Outcome(
    "internal error",
    3,
    "internal error",
    "stagebench's own bug in the analysis or the report, on rows a run produced",
    "run.json, results.csv, error.log (the traceback), a minimal summary.json and report.html",
)
PARTIAL = Outcome(
    "partial",
    4,
    "partial",
    "measured, but a file could not be written (a full disk, a permission)",
    "what could be written; no temporary file left behind",
)
INTERRUPTED = Outcome(
    "interrupted",
    130,
    "interrupted",
    "Ctrl-C (SIGINT): the rows measured so far are kept",
    "run.json, results.csv, summary.json and report.html of the rows kept",
)
TERMINATED = Outcome(
    "terminated",
    143,
    "terminated",
    "SIGTERM (a scheduler's kill, `timeout`): as Ctrl-C",
    "run.json, results.csv, summary.json and report.html of the rows kept",
)

RANK_LOST = Outcome(
    "rank lost",
    5,
    "rank lost",
    "a rank of the host's data-parallel job ended, stopped answering or never arrived: every rank ends, "
    "the rows measured so far are kept",
    "run.json, results.csv, summary.json and report.html of the rows kept (local rank 0's run directory)",
)

OUTCOMES = (COMPLETE, FAILED, BAD_INPUT, INTERNAL, PARTIAL, INTERRUPTED, TERMINATED, RANK_LOST)


def interrupted_outcome(exc: BaseException) -> Outcome:
    """The outcome of a run an interrupt ended: a rank lost, SIGTERM or Ctrl-C."""
    if isinstance(exc, RankLost):
        return RANK_LOST
    return TERMINATED if isinstance(exc, Terminated) else INTERRUPTED


def outcome(status: str | None) -> Outcome:
    """The outcome a ``run.json`` status stands for (COMPLETE for a run written before statuses)."""
    return next((o for o in OUTCOMES if o.status == status), COMPLETE)
