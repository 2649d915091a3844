"""The two kinds of run, one interface: what a DataLoader's sweep and an SPDL pipeline's diagnosis each do
their own way.

Every step that differs by kind goes through :class:`RunKind`: summarise the rows, offer the job runs'
candidates, make the job's pick the recommendation, print the table a run ends with, give the report's
page its title and context. The analysis implements the first three (:mod:`stagebench.analysis._summary`), the
report the whole kind (:mod:`stagebench.report._kinds`: ``LOADER``, ``PIPELINE``, ``kind_of``). Both
summaries open with the same keys (:func:`summary_head`) and say the job the same way (:func:`job_keys`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Protocol, TypeVar

from stagebench._version import __version__
from stagebench.analysis._job import alone_scope, trainer_summary
from stagebench.core._jobrun import Ladder
from stagebench.model._job import JobVerdict
from stagebench.model._meta import RunMeta
from stagebench.model._rate import Rate
from stagebench.runs._schema import SUMMARY_SCHEMA_VERSION

__all__ = ["KindAnalysis", "RunKind", "summary_head", "job_keys"]

#: What a kind's job pick is applied to (the loader's points, the pipeline's stage entries) and gives back.
Among = TypeVar("Among", contravariant=True)
Picked = TypeVar("Picked", covariant=True)
#: The loaded run a kind's page is drawn from (the report's ``RunData``).
Run = TypeVar("Run", contravariant=True)


class KindAnalysis(Protocol[Among, Picked]):
    """A kind of run as the analysis knows it: ``name`` is ``run.json["kind"]``."""

    name: str

    def summarize(self, rows: Any, meta: dict[str, Any]) -> dict[str, Any]:
        """``summary.json`` from the rows of ``results.csv`` and ``run.json``; returns it."""

    def job_candidates(self, rows: Any, meta: dict[str, Any], demand: Rate | None) -> Ladder:
        """The settings to run the user's loop with, given the step's ``demand`` (None where not measured)."""

    def apply_job_pick(self, among: Among, job: JobVerdict) -> Picked:
        """The job runs' decided pick made the recommendation among the kind's points or stages."""


class RunKind(KindAnalysis[Among, Picked], Protocol[Among, Picked, Run]):
    """A kind of run whole: its analysis, and how a run of it is presented."""

    def table(self, summary: Mapping[str, Any], report_path: str | os.PathLike[str] | None = None) -> str:
        """The text printed when a run ends: its table, the job runs', the report's path where given."""

    def title(self, run: Run) -> str:
        """The report's title for the run."""

    def page_context(self, run: Run) -> dict[str, Any]:
        """What the report's template draws the kind's page from."""


def summary_head(kind: str, m: RunMeta, no_provenance: dict[str, Any] | None) -> dict[str, Any]:
    """The keys every summary opens with: the schema, the kind, stagebench's version, the machine
    (``no_provenance`` where ``run.json`` has none) and the settings."""
    return {
        "schema_version": SUMMARY_SCHEMA_VERSION,
        "kind": kind,
        "stagebench_version": __version__,
        "provenance": no_provenance if m.provenance is None else m.provenance.to_json(),
        "settings": m.settings.to_json(),
    }


def job_keys(what: str, m: RunMeta, v: JobVerdict | None, *, planned: bool, picked: bool = True) -> dict[str, Any]:
    """The summary's ``trainer``, ``job`` and ``scope``: the step alone, the job runs' verdict (None where they
    did not run), and what the pick is for (``what``: "the loader", "the pipeline"; no scope where nothing was
    picked: ``picked`` False, a loader no setting of which ran, a pipeline that delivers nothing)."""
    return {
        "trainer": trainer_summary(m.trainer, v),
        "job": None if v is None else v.to_json(),
        "scope": alone_scope(what, m.step, m.settings, planned=planned) if picked else None,
    }
