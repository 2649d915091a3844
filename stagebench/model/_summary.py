"""A summary's top level: what ``summary.json`` says about a run, as the report and the terminal read it.

Both kinds of run (a pipeline's stages, a DataLoader's grid) write one summary with a few common facts
(``kind``, ``verdict``, ``scope``, ``warnings``, ``findings``, the versions) and sections of their own.
:class:`Summary` reads the top level once, with the default a missing key reads as, so a reader names a
fact instead of restating its key and fallback. The whole pipeline's sections are typed here
(:mod:`stagebench.model._pipeline`); the sections other types describe (the job, the stages, the loader's
points) are kept as the summary holds them, for those types to read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from stagebench.model._finding import Finding
from stagebench.model._job import JobVerdict, StepAlone
from stagebench.model._json import Coercions, Read, filled, integer, mapping, number, text, texts
from stagebench.model._loader import LoaderPoint, WorkerCosts
from stagebench.model._meta import LoaderInfo, Provenance, RunSettings
from stagebench.model._pipeline import CpuSpeed, Demand, Joint, Prediction, Search, VersusYours, WholeRun
from stagebench.model._stage import StageEntry

__all__ = ["Summary"]


def _list(v: Any) -> list[Any]:
    return list(v) if isinstance(v, (list, tuple)) else []


def _findings(v: Any) -> list[Finding]:
    return [Finding.from_json(f) for f in _list(v) if isinstance(f, Mapping)]


@dataclass(frozen=True, slots=True)
class Summary(Read):
    """One run's ``summary.json``, top level: the common facts, the whole pipeline's sections typed, and
    the other sections as written (None or empty where absent). ``to_json`` gives back the dict it was
    read from: the summary is written by the analysis, never rebuilt from this view."""

    kind: str | None = None
    verdict: str | None = None
    scope: str | None = None
    warnings: tuple[str, ...] = ()
    findings: list[Finding] = field(default_factory=list)
    stagebench_version: str | None = None
    schema_version: int | None = None
    cores: int | float | None = None
    prediction: Prediction = field(default_factory=Prediction)
    validation: WholeRun = field(default_factory=WholeRun)
    recommended_vs_yours: VersusYours = field(default_factory=VersusYours)
    demand: Demand = field(default_factory=Demand)
    cpu_speed: CpuSpeed | None = None
    joint: Joint = field(default_factory=Joint)
    search: Search | None = None
    stages: list[StageEntry] = field(default_factory=list)
    not_isolated: list[dict[str, Any]] = field(default_factory=list)
    job: JobVerdict | None = None
    trainer: StepAlone = field(default_factory=StepAlone)
    #: run.json's records as the summary copies them (None: not copied, or empty)
    provenance: Provenance | None = None
    settings: RunSettings | None = None
    loader: LoaderInfo | None = None
    recommended: Mapping[str, Any] | None = None
    best: Mapping[str, Any] | None = None
    target: Mapping[str, Any] | None = None
    user_setting: Mapping[str, Any] | None = None
    worker_costs: WorkerCosts | None = None
    points: list[LoaderPoint] = field(default_factory=list)
    transforms: list[StageEntry] = field(default_factory=list)
    validation_failed: str | None = None
    """Why the real pipeline's run failed (it delivered nothing); None: it did not fail."""
    fallback: bool = False
    """Whether this is the minimal summary written where the analysis raised."""
    _json: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    READ: ClassVar[Coercions] = {
        "prediction": Prediction.from_json,
        "validation": WholeRun.from_json,
        "recommended_vs_yours": VersusYours.from_json,
        "demand": Demand.from_json,
        "cpu_speed": CpuSpeed.from_json,
        "joint": Joint.from_json,
        "search": Search.from_json,
        **dict.fromkeys(("kind", "verdict", "scope", "stagebench_version"), text),
        "warnings": texts,
        "findings": _findings,
        **dict.fromkeys(("stages", "transforms"), lambda v: [StageEntry.from_json(x) for x in _list(v)]),
        "not_isolated": _list,
        "validation_failed": text,
        "fallback": bool,
        "points": lambda v: [LoaderPoint.from_json(x) for x in _list(v)],
        "schema_version": integer,
        "cores": number,  # a quota's share is a fraction of a core (1.5)
        "job": JobVerdict.from_json,
        "trainer": StepAlone.from_json,
        "provenance": filled(Provenance.from_json),
        "settings": filled(RunSettings.from_json),
        "loader": filled(LoaderInfo.from_json),
        "worker_costs": filled(WorkerCosts.from_json),
        **dict.fromkeys(("recommended", "best", "target", "user_setting"), mapping),
    }
