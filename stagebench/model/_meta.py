"""A run's metadata: what ``run.json`` says was run, where, and with which settings.

The analysis and the report read run.json's facts (the machine's cores, the settings a verdict depends
on, the loader under test and the user's own knobs) in many places. :class:`RunMeta` reads them once
from JSON, so that a fact run.json does not hold reads the same everywhere: None (each reader states
its own default where it needs one), an empty mapping or an empty tuple.

The records other types describe (each stage's entry, the job, the trainer, the whole-pipeline runs)
are kept here as the mappings run.json holds, for those types to read. ``to_json`` gives back the
mapping each type was read from, keys it does not name included: run.json and the summary.json that
copies parts of it stay exactly as written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RunMeta", "Provenance", "RunSettings", "LoaderInfo", "UserKnobs", "SearchRecord"]


def _record(x: Any) -> dict[str, Any] | None:
    """A record other types read, as run.json holds it (the same dict); None where there is none."""
    return x if isinstance(x, dict) else dict(x) if isinstance(x, Mapping) else None


def _records(x: Any) -> tuple[dict[str, Any], ...]:
    return tuple(r for r in (_record(r) for r in x) if r is not None) if isinstance(x, (list, tuple)) else ()


@dataclass(frozen=True, slots=True)
class Provenance:
    """The machine and process a measurement was taken on (``run.json["provenance"]``, and
    ``provenance_after`` at the end): what makes a throughput a claim anyone can check. Each fact as
    written, None where not recorded (``free_threaded`` too: an older run is not another machine);
    ``recorded`` says whether anything was."""

    hostname: str | None = None
    platform: str | None = None
    cpu_model: str | None = None
    cpu_count: int | float | None = None
    usable_cores: int | float | None = None
    memory_total_gb: int | float | None = None
    memory_available_gb: int | float | None = None
    python: str | None = None
    python_implementation: str | None = None
    free_threaded: bool | None = None
    libraries: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, Any] = field(default_factory=dict)
    load_avg: tuple[float, ...] = ()
    taken_at: str | None = None
    _json: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> Provenance:
        d = d if isinstance(d, Mapping) else {}
        la = d.get("load_avg")
        return cls(
            hostname=d.get("hostname"),
            platform=d.get("platform"),
            cpu_model=d.get("cpu_model"),
            cpu_count=d.get("cpu_count"),
            usable_cores=d.get("usable_cores"),
            memory_total_gb=d.get("memory_total_gb"),
            memory_available_gb=d.get("memory_available_gb"),
            python=d.get("python"),
            python_implementation=d.get("python_implementation"),
            free_threaded=d.get("free_threaded"),
            libraries=dict(d.get("libraries") or {}),
            env=dict(d.get("env") or {}),
            load_avg=tuple(la) if isinstance(la, (list, tuple)) else (),
            taken_at=d.get("taken_at"),
            _json=dict(d),
        )

    def to_json(self) -> dict[str, Any]:
        """The mapping it was read from, as written."""
        return dict(self._json)

    @property
    def recorded(self) -> bool:
        """Whether run.json recorded any of it."""
        return bool(self._json)

    @property
    def cores(self) -> int | float | None:
        """The cores the run could use: the usable ones where recorded, else the machine's count."""
        return self.usable_cores or self.cpu_count


#: the knobs a script passes to its DataLoader, as run.json names them
_KNOBS = ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory")


@dataclass(frozen=True, slots=True)
class UserKnobs:
    """The loader knobs the user's script passed (``run.json["loader"]["user_knobs"]``), each None where
    the script's call did not give it; ``given`` names those it did, in run.json's order (a value of
    None can be given: ``prefetch_factor=None``). ``to_json`` is the mapping as written."""

    num_workers: int | None = None
    prefetch_factor: int | None = None
    persistent_workers: bool | None = None
    pin_memory: bool | None = None
    given: tuple[str, ...] = ()
    _json: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> UserKnobs:
        d = d if isinstance(d, Mapping) else {}
        return cls(
            num_workers=d.get("num_workers"),
            prefetch_factor=d.get("prefetch_factor"),
            persistent_workers=d.get("persistent_workers"),
            pin_memory=d.get("pin_memory"),
            given=tuple(k for k in d if k in _KNOBS),
            _json=dict(d),
        )

    def to_json(self) -> dict[str, Any]:
        """The knobs as run.json holds them (only those given): what ``LoaderKnobs(**...)`` takes."""
        return dict(self._json)

    def gave(self, knob: str) -> bool:
        """Whether the script's call set ``knob``."""
        return knob in self.given


@dataclass(frozen=True, slots=True)
class LoaderInfo:
    """The loader under test (``run.json["loader"]``, copied to a loader summary): its name, backend and
    batches, the user's other DataLoader arguments (``call``) and own knobs (``user_knobs``, None where
    the script's were not read)."""

    name: str | None = None
    backend: str | None = None
    batch_size: int | float | None = None
    epoch_batches: Any = None
    call: tuple[Mapping[str, Any], ...] = ()
    user_knobs: UserKnobs | None = None
    _json: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> LoaderInfo:
        d = d if isinstance(d, Mapping) else {}
        knobs = d.get("user_knobs")
        return cls(
            name=d.get("name"),
            backend=d.get("backend"),
            batch_size=d.get("batch_size"),
            epoch_batches=d.get("epoch_batches"),
            call=_records(d.get("call")),
            user_knobs=UserKnobs.from_json(knobs) if isinstance(knobs, Mapping) and knobs else None,
            _json=dict(d),
        )

    def to_json(self) -> dict[str, Any]:
        return dict(self._json)

    @property
    def recorded(self) -> bool:
        """Whether run.json recorded anything of the loader."""
        return bool(self._json)


@dataclass(frozen=True, slots=True)
class RunSettings:
    """The settings the run was made with (``run.json["settings"]``): the ones a verdict depends on, None
    where not recorded (each reader keeps its own default); ``to_json`` has them all, as written."""

    target_rate: int | float | None = None
    quick: str | None = None
    trainer: str | None = None
    trainer_s: int | float | None = None
    job_s: int | float | None = None
    cuda: bool = False
    usable_cores: int | float | None = None
    memory_budget_mb: int | float | None = None
    headroom: int | float | None = None
    within_best: int | float | None = None
    confidence: int | float | None = None
    strategy: str | None = None
    full_grid_points: int | float | None = None
    _json: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> RunSettings:
        d = d if isinstance(d, Mapping) else {}
        return cls(
            target_rate=d.get("target_rate"),
            quick=d.get("quick"),
            trainer=d.get("trainer"),
            trainer_s=d.get("trainer_s"),
            job_s=d.get("job_s"),
            cuda=bool(d.get("cuda")),
            usable_cores=d.get("usable_cores"),
            memory_budget_mb=d.get("memory_budget_mb"),
            headroom=d.get("headroom"),
            within_best=d.get("within_best"),
            confidence=d.get("confidence"),
            strategy=d.get("strategy"),
            full_grid_points=d.get("full_grid_points"),
            _json=dict(d),
        )

    def to_json(self) -> dict[str, Any]:
        return dict(self._json)

    @property
    def recorded(self) -> bool:
        return bool(self._json)


@dataclass(frozen=True, slots=True)
class SearchRecord:
    """How a loader sweep searched (``run.json["search"]``): its strategy, seconds, and why it stopped
    where it did (``stopped``: one line each)."""

    strategy: str | None = None
    seconds: int | float | None = None
    stopped: tuple[str, ...] = ()
    interrupted: bool = False

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> SearchRecord:
        d = d if isinstance(d, Mapping) else {}
        return cls(
            strategy=d.get("strategy"),
            seconds=d.get("seconds"),
            stopped=tuple(d.get("stopped") or ()),
            interrupted=bool(d.get("interrupted")),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "seconds": self.seconds,
            "stopped": list(self.stopped),
            "interrupted": self.interrupted,
        }


@dataclass(frozen=True, slots=True)
class RunMeta:
    """``run.json``: the run's kind and status, when and how it was started, the machine before and
    after (``provenance``, ``provenance_after``: None where not recorded), its settings, the loader
    under test, and the records other types read (kept as written)."""

    kind: str | None = None
    status: str | None = None
    created_at: str | None = None
    command: tuple[str, ...] | str | None = None
    provenance: Provenance | None = None
    provenance_after: Provenance | None = None
    settings: RunSettings = field(default_factory=RunSettings)
    loader: LoaderInfo = field(default_factory=LoaderInfo)
    search: SearchRecord = field(default_factory=SearchRecord)
    num_threads: int | float | None = None
    sink_buffer: int | float | None = None
    phases_s: dict[str, Any] | None = None
    warnings: tuple[str, ...] = ()
    trainer_planned: bool = False
    #: each stage's entry (pipeline runs) and the stages that could not be measured alone
    stages: tuple[dict[str, Any], ...] = ()
    not_isolated: tuple[dict[str, Any], ...] = ()
    #: a loader's transforms measured as stages
    transforms: tuple[dict[str, Any], ...] = ()
    #: the records other types read, as run.json holds them (None: not recorded)
    trainer: dict[str, Any] | None = None
    job: dict[str, Any] | None = None
    validation: dict[str, Any] | None = None
    replay: dict[str, Any] | None = None
    yours: dict[str, Any] | None = None
    cpu_speed: dict[str, Any] | None = None
    page_fault: dict[str, Any] | None = None
    pipeline_overhead: dict[str, Any] | None = None
    worker_costs: dict[str, Any] | None = None
    _json: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> RunMeta:
        d = d if isinstance(d, Mapping) else {}
        cmd = d.get("command")
        before, after = d.get("provenance"), d.get("provenance_after")
        return cls(
            kind=d.get("kind"),
            status=d.get("status"),
            created_at=d.get("created_at"),
            command=tuple(cmd) if isinstance(cmd, (list, tuple)) else cmd,
            provenance=Provenance.from_json(before) if isinstance(before, Mapping) else None,
            provenance_after=Provenance.from_json(after) if isinstance(after, Mapping) else None,
            settings=RunSettings.from_json(d.get("settings")),
            loader=LoaderInfo.from_json(d.get("loader")),
            search=SearchRecord.from_json(d.get("search")),
            num_threads=d.get("num_threads"),
            sink_buffer=d.get("sink_buffer"),
            phases_s=_record(d.get("phases_s")),
            warnings=tuple(str(w) for w in d.get("warnings", []) or []),
            trainer_planned=bool(d.get("trainer_planned")),
            stages=_records(d.get("stages")),
            not_isolated=tuple(d.get("not_isolated") or ()),
            transforms=tuple(d.get("transforms") or []),
            trainer=_record(d.get("trainer")),
            job=_record(d.get("job")),
            validation=_record(d.get("validation")),
            replay=_record(d.get("replay")),
            yours=_record(d.get("yours")),
            cpu_speed=_record(d.get("cpu_speed")),
            page_fault=_record(d.get("page_fault")),
            pipeline_overhead=_record(d.get("pipeline_overhead")),
            worker_costs=_record(d.get("worker_costs")),
            _json=dict(d),
        )

    def to_json(self) -> dict[str, Any]:
        """run.json as it was read."""
        return dict(self._json)
