"""A run directory as the report reads it: run.json, the rows and the summary, typed once where the
run is loaded, so that each page and figure reads the model's fields, not the dicts' keys; and a job
that left no run directory to read (:class:`FailedJob`), listed beside the runs a comparison shows.

The summary's copies of the provenance, settings and loader come first: the summary is what the
page presents, and ``run.json`` is its fallback for runs whose summary could not be computed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stagebench.model._job import JobVerdict
from stagebench.model._meta import LoaderInfo, Provenance, RunMeta, RunSettings
from stagebench.model._stage import StageEntry
from stagebench.model._summary import Summary
from stagebench.runs._schema import SUMMARY_SCHEMA_VERSION

if TYPE_CHECKING:  # a sweep's parent reads FailedJob and never loads pandas for it
    import pandas as pd

__all__ = ["RunData", "FailedJob", "stored_summary"]


@dataclass(frozen=True, slots=True)
class RunData:
    """Everything a report needs from one run directory.

    ``summary`` keeps the dict it was read from (``summary.to_json()``): the page embeds it as the
    machine-readable copy. ``stages`` and ``transforms`` are the summary's entries (a pipeline's
    stages, a loader's transforms measured as stages), ``job`` its job verdict (None where no job ran).
    """

    path: Path
    meta: RunMeta
    rows: pd.DataFrame
    summary: Summary
    summary_error: str | None = None
    csv_bytes: bytes = b""
    kind: str = "pipeline"
    transform_rows: pd.DataFrame | None = None

    @property
    def stages(self) -> tuple[StageEntry, ...]:
        """The summary's stage entries (a pipeline's stages)."""
        return tuple(self.summary.stages)

    @property
    def transforms(self) -> tuple[StageEntry, ...]:
        """A loader's transforms, measured as stages: the summary's entries."""
        return tuple(self.summary.transforms)

    @property
    def job(self) -> JobVerdict | None:
        """The summary's job verdict (None where no job ran)."""
        return self.summary.job

    @property
    def provenance(self) -> Provenance:
        """The machine the run was measured on: the summary's copy, else run.json's (empty where neither has it)."""
        return self.summary.provenance or self.meta.provenance or Provenance()

    @property
    def settings(self) -> RunSettings:
        """The run's settings: the summary's copy, else run.json's."""
        return self.summary.settings or self.meta.settings

    @property
    def loader(self) -> LoaderInfo:
        """The loader under test (loader runs): the summary's copy, else run.json's."""
        return self.summary.loader or self.meta.loader


@dataclass(frozen=True, slots=True)
class FailedJob:
    """A job or run that left nothing to compare: its name, why, and its folder ("" where it left none)."""

    name: str
    reason: str = ""
    path: str = ""
    #: a planned job's overrides and number, where the sweep's plan names them
    overrides: tuple[str, ...] = ()
    job_num: int | None = None


def stored_summary(path: Path) -> dict[str, Any]:
    """summary.json as saved; {} (so it is computed again from the rows) when it is damaged or was
    written with another summary schema: it is derived, and the rows are the source of truth."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("schema_version", SUMMARY_SCHEMA_VERSION) != SUMMARY_SCHEMA_VERSION:
        return {}
    return data
