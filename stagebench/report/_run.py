"""A run directory as the report reads it: its metadata, rows and summary in one object.

The summary's copies of the provenance, settings and loader come first: the summary is what the
page presents, and ``run.json`` is its fallback for runs whose summary could not be computed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from stagebench.model._meta import LoaderInfo, Provenance, RunMeta, RunSettings
from stagebench.runs._schema import SUMMARY_SCHEMA_VERSION

__all__ = ["RunData", "stored_summary"]


@dataclass(slots=True)
class RunData:
    """Everything a report needs from one run directory."""

    path: Path
    meta: dict[str, Any]
    rows: pd.DataFrame
    summary: dict[str, Any]
    summary_error: str | None = None
    csv_bytes: bytes = b""
    kind: str = "pipeline"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def run_meta(self) -> RunMeta:
        """run.json, typed."""
        return RunMeta.from_json(self.meta)

    @property
    def provenance(self) -> Provenance:
        """The machine the run was measured on: the summary's copy, else run.json's (empty where neither has it)."""
        copy = self.summary.get("provenance")
        return Provenance.from_json(copy) if copy else self.run_meta.provenance or Provenance()

    @property
    def settings(self) -> RunSettings:
        """The run's settings: the summary's copy, else run.json's."""
        copy = self.summary.get("settings")
        return RunSettings.from_json(copy) if copy else self.run_meta.settings

    @property
    def loader(self) -> LoaderInfo:
        """The loader under test (loader runs): the summary's copy, else run.json's."""
        copy = self.summary.get("loader")
        return LoaderInfo.from_json(copy) if copy else self.run_meta.loader


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
