"""A run's metadata: what ``run.json`` says was run, where, and with which settings.

The analysis and the report read run.json's facts (the machine's cores, the settings a verdict depends
on, the loader under test and the user's own knobs) in many places. :class:`RunMeta` reads them once
from JSON, so that a fact run.json does not hold reads the same everywhere: None (each reader states
its own default where it needs one), an empty mapping or an empty tuple.

The records other types describe (each stage's entry, the trainer, SPDL's own overhead) are kept here as
the mappings run.json holds, for those types to read; the job's runs, the whole-pipeline runs, the core's
speed and a page fault's cost are read as their own types. ``to_json`` gives back the mapping each type was read from, keys it
does not name included: run.json and the summary.json that copies parts of it stay exactly as written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from stagebench.model._job import JobRecord, StepAlone
from stagebench.model._json import (
    Coercions,
    Read,
    ReadIfGiven,
    Written,
    dict_of,
    filled,
    given,
    items,
    number,
    nums,
    read,
    record,
    records,
    texts,
)
from stagebench.model._knobs import KNOBS
from stagebench.model._limits import HostLimits
from stagebench.model._loader import WorkerCosts
from stagebench.model._pipeline import JointReplays, WholeRun
from stagebench.model._ranks import Ranks

__all__ = [
    "RunMeta",
    "Provenance",
    "RunSettings",
    "LoaderInfo",
    "UserKnobs",
    "SearchRecord",
    "RunEnd",
    "CpuReadings",
    "PageFault",
]


def _ranks(v: Any) -> Ranks:
    try:
        return Ranks.from_json(v) if isinstance(v, Mapping) else Ranks()
    except (TypeError, ValueError):  # a hand-edited run.json: read as one rank, as runs before ranks were
        return Ranks()


@dataclass(frozen=True, slots=True)
class Provenance(Read):
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
    ranks: Ranks = field(default_factory=Ranks)
    """The data-parallel job's ranks (one rank of one host where not recorded: runs before ranks were)."""
    #: the cores and the memory the job could use and where each came from (None: a run before it was kept)
    limits: HostLimits | None = None
    _json: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    READ: ClassVar[Coercions] = {
        "libraries": dict_of,
        "env": dict_of,
        "load_avg": nums,
        "ranks": _ranks,
        "limits": HostLimits.from_json,
    }

    @property
    def recorded(self) -> bool:
        """Whether run.json recorded any of it."""
        return bool(self._json)

    @property
    def cores(self) -> int | float | None:
        """The cores the run could use: the usable ones where recorded, else the machine's count."""
        return self.usable_cores or self.cpu_count


@dataclass(frozen=True, slots=True)
class UserKnobs(Written):
    """The loader knobs the user's script passed (``run.json["loader"]["user_knobs"]``), each None where
    the script's call did not give it; ``given`` names those it did, in run.json's order (a value of
    None can be given: ``prefetch_factor=None``). ``to_json`` is the mapping as written: only the knobs
    the script gave, which is what ``LoaderKnobs(**...)`` takes to rebuild the user's setting."""

    num_workers: int | None = None
    prefetch_factor: int | None = None
    persistent_workers: bool | None = None
    pin_memory: bool | None = None
    given: tuple[str, ...] = ()
    _json: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> UserKnobs:
        return read(cls, d, {"given": tuple(k for k in d or {} if k in KNOBS)})

    def gave(self, knob: str) -> bool:
        """Whether the script's call set ``knob``."""
        return knob in self.given


@dataclass(frozen=True, slots=True)
class LoaderInfo(Read):
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

    READ: ClassVar[Coercions] = {"call": records, "user_knobs": filled(UserKnobs.from_json)}


@dataclass(frozen=True, slots=True)
class RunSettings(Read):
    """The settings the run was made with (``run.json["settings"]``): the ones a verdict depends on, None
    where not recorded (each reader keeps its own default); ``to_json`` has them all, as written."""

    target_rate: int | float | None = None
    quick: str | None = None
    trainer: str | None = None
    trainer_s: int | float | None = None
    job_s: int | float | None = None
    cuda: bool = False
    usable_cores: int | float | None = None
    ranks: int | float | None = None
    """The host's ranks a loader sweep ran at once (written only where more than one)."""
    memory_budget_mb: int | float | None = None
    headroom: int | float | None = None
    within_best: int | float | None = None
    confidence: int | float | None = None
    tie_rounds: int | None = None
    """A loader sweep's most rounds in turns (its intervals' level is fitted to them)."""
    strategy: str | None = None
    full_grid_points: int | float | None = None
    _json: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    READ: ClassVar[Coercions] = {"cuda": bool}


@dataclass(frozen=True, slots=True)
class SearchRecord(Read):
    """How a loader sweep searched (``run.json["search"]``): its strategy, seconds, and why it stopped
    where it did (``stopped``: one line each)."""

    strategy: str | None = None
    seconds: int | float | None = None
    stopped: tuple[str, ...] = ()
    interrupted: bool = False

    READ: ClassVar[Coercions] = {"stopped": items, "interrupted": bool}


@dataclass(frozen=True, slots=True)
class RunEnd(ReadIfGiven):
    """How a run whose ``run.json`` still said ``running`` ended, as ``stagebench report`` found it
    (``run.json["ended"]``): ``by`` what (``"oom"``: the OOM killer, its cgroup's ``oom_kill`` count grew
    from ``oom_kills[0]`` to ``oom_kills[1]``; None: nothing shows what), and ``text``, in words."""

    text: str
    by: str | None = None
    oom_kills: tuple[int, ...] = ()

    READ: ClassVar[Coercions] = {"text": str, "by": lambda v: None if v is None else str(v), "oom_kills": items}

    @classmethod
    def holds(cls, d: Mapping[str, Any]) -> bool:
        """A record says in words how the run ended."""
        return bool(d.get("text"))


@dataclass(frozen=True, slots=True)
class PageFault(Read):
    """What one minor page fault costs on the run's machine (``run.json["page_fault"]``): CPU seconds (None
    where nothing faulted) and the page's size in bytes."""

    cost_s: float | None = None
    page_bytes: int = 4096

    READ: ClassVar[Coercions] = {"cost_s": number, "page_bytes": lambda v: int(v or 4096)}


@dataclass(frozen=True, slots=True)
class CpuReadings(Read):
    """The core's speed as a diagnosis read it (``run.json["cpu_speed"]``): a fixed Python loop's CPU ns per
    iteration (:func:`stagebench.core._speed.cpu_speed_ns`, lower is faster) after each measured point
    (``sweep_ns``), as each stage's stand-in's CPU amounts were measured (``stage_ns``), and before and after
    the validation run (``validation_ns``); each written only where it was read."""

    sweep_ns: tuple[float, ...] | None = None
    stage_ns: Mapping[str, float] | None = None
    validation_ns: tuple[float, ...] | None = None

    READ: ClassVar[Coercions] = {"sweep_ns": nums, "stage_ns": dict_of, "validation_ns": nums}
    OPTIONAL = frozenset({"sweep_ns", "stage_ns", "validation_ns"})


@dataclass(frozen=True, slots=True)
class RunMeta(Read):
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
    label: str | None = None
    """The run's own name, where it was given one."""
    phases_s: dict[str, float] | None = None
    """Seconds the diagnosis spent in each phase, and in all (``total``)."""
    warnings: tuple[str, ...] = ()
    trainer_planned: bool = False
    #: each stage's entry (pipeline runs) and the stages that could not be measured alone
    stages: tuple[dict[str, Any], ...] = ()
    not_isolated: tuple[dict[str, Any], ...] = ()
    #: a loader's transforms measured as stages
    transforms: tuple[dict[str, Any], ...] = ()
    #: the records other types read, as run.json holds them (None: not recorded)
    trainer: dict[str, Any] | None = None
    job: JobRecord | None = None
    validation: WholeRun | None = None
    replay: WholeRun | None = None
    yours: WholeRun | None = None
    #: the replays that settled the joint choice between the bounds' best assignment and a cheaper one
    joint_replays: JointReplays | None = None
    cpu_speed: CpuReadings | None = None
    page_fault: PageFault | None = None
    pipeline_overhead: dict[str, Any] | None = None
    worker_costs: WorkerCosts | None = None
    #: how a run that never finished ended, where ``stagebench report`` found out (None: not looked at)
    ended: RunEnd | None = None
    _json: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    READ: ClassVar[Coercions] = {
        "command": lambda c: tuple(c) if isinstance(c, (list, tuple)) else c,
        "settings": RunSettings.from_json,
        "loader": LoaderInfo.from_json,
        "search": SearchRecord.from_json,
        "warnings": texts,
        "stages": records,
        **dict.fromkeys(("provenance", "provenance_after"), given(Provenance.from_json)),
        **dict.fromkeys(("phases_s", "trainer", "pipeline_overhead"), record),
        "trainer_planned": bool,
        "label": lambda v: str(v) if v else None,
        "job": given(JobRecord.from_json),
        "cpu_speed": given(CpuReadings.from_json),
        "page_fault": given(PageFault.from_json),
        **dict.fromkeys(("validation", "replay", "yours"), given(WholeRun.from_json)),
        "joint_replays": given(JointReplays.from_json),
        "worker_costs": filled(WorkerCosts.from_json),
        "ended": RunEnd.from_json,
        **dict.fromkeys(("not_isolated", "transforms"), items),
    }

    @property
    def step(self) -> StepAlone | None:
        """The step alone (``trainer``) typed; None where it was not measured."""
        return None if self.trainer is None else StepAlone.from_json(self.trainer)

    @property
    def ranks(self) -> int:
        """The host's ranks the run measured together (its figures are the host's); 1 on one process, and
        for a run written before ranks were recorded."""
        return 1 if self.provenance is None else self.provenance.ranks.local_world_size
