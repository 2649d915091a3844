"""A loader sweep's measured setting, and what its workers cost beyond throughput.

:class:`LoaderPoint` is one setting of a loader as ``summary.json`` holds it (``points``, ``recommended``,
``best``, ``user_setting``) and as the analysis pools it from the rows: its knobs, its throughput with its
interval (:class:`~stagebench.model._rate.Rate`), what it held of memory and cores, and how it ended.
:class:`WorkerCosts` is ``summary.json["worker_costs"]``: the start-up split per number of workers, the
dataset shipped to each worker, each worker's memory over an epoch and the shared memory the batches in
flight take (:mod:`stagebench.loader._costs` measures them, :mod:`stagebench.analysis._worker_costs` reads
them). Both are read once from their dicts, where the readers then see attributes of known types.

Numbers keep the value they were read with, NaN included: a point read from the rows holds NaN where a
column is empty, and what is shown of it (a dash) must not change with the reading. A key that is absent,
or holds no number, reads as None.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from typing import Any

from stagebench._numbers import num
from stagebench.model._evidence import Decision
from stagebench.model._json import (
    Read,
    ReadIfGiven,
    Written,
    dict_of,
    flag,
    given,
    number,
    read,
    span,
    text,
    whole,
)
from stagebench.model._knobs import KNOBS, NOT_APPLICABLE, LoaderKnobs
from stagebench.model._limits import MemoryLimit
from stagebench.model._rate import Rate

__all__ = [
    "LoaderPoint",
    "LoaderRow",
    "LoaderTarget",
    "StartupSplit",
    "Largest",
    "Shipping",
    "MemorySample",
    "WorkerMemory",
    "Shm",
    "WorkerCosts",
    "STARTUP_KEYS",
    "STALL_NOT_MEASURED",
    "with_note",
]

#: How a row's note begins where its epoch stall was to be measured and was not (the reason follows): the
#: sweep writes it, the analysis carries it to the pick's finding.
STALL_NOT_MEASURED = "epoch stall not measured: "
#: Between two notes in a row's ``notes``.
_NOTE_SEP = "; "


def with_note(notes: str, note: str) -> str:
    """``notes`` with ``note`` added (a row's ``notes``: as the sweep writes them and the analysis reads them)."""
    return f"{notes}{_NOTE_SEP}{note}" if notes else note


#: The start-up split of a setting with workers, as the rows record it (seconds; docs/loaders.md).
STARTUP_KEYS = (
    "time_to_first_batch_s",
    "workers_start_s",
    "worker_init_s",
    "first_batch_work_s",
    "first_delivery_s",
    "workers_start_last_s",
    "workers_created_s",
    "worker_boot_s",
    "worker_unsplit_s",
)


def _knob_flag(v: Any) -> bool | str | None:
    """``persistent_workers`` / ``pin_memory``: True, False, or the words saying it does not apply."""
    return v if isinstance(v, (bool, str)) else None


@dataclass(frozen=True, slots=True)
class StartupSplit(Read):
    """Where a setting's time to its first batch goes (seconds, medians over the workers; None where not
    recorded): the workers started (created, booted), your ``worker_init_fn``, the first batch's own work,
    its delivery; under SPDL's loader the start is one figure, ``worker_unsplit_s``. Written as a row of
    ``summary.json["worker_costs"]["startup"]``: the setting first."""

    #: ``summary.json["worker_costs"]["startup"]`` only: the setting in words and its workers
    setting: str | None = None
    num_workers: int | None = None
    time_to_first_batch_s: float | None = None
    workers_start_s: float | None = None
    worker_init_s: float | None = None
    first_batch_work_s: float | None = None
    first_delivery_s: float | None = None
    workers_start_last_s: float | None = None
    workers_created_s: float | None = None
    worker_boot_s: float | None = None
    worker_unsplit_s: float | None = None

    READ = {"setting": text, "num_workers": whole, **dict.fromkeys(STARTUP_KEYS, number)}


@dataclass(frozen=True, slots=True)
class LoaderTarget(Written):
    """The trainer's demand against the loader alone (``summary.json["target"]``): the samples/s it needs,
    with the headroom, whether the fastest setting alone meets that, the words of the verdict, and whether
    the demand was ``measured`` (the training step) or ``stated``."""

    rate: float
    needed_with_headroom: float
    met: bool
    verdict: str
    source: str


#: :class:`LoaderPoint`'s figures, each a number as written
_POINT_NUMBERS: tuple[str, ...] = ("batches_per_s", "mem_pss_mb", "mem_workers_mb", "cores_used")
_POINT_NUMBERS += ("time_to_first_batch_s", "epoch_stall_s", "rank_min_samples_per_s", "rank_max_samples_per_s")


@dataclass(frozen=True, slots=True)
class LoaderPoint:
    """One measured loader setting: its knobs, its throughput with its interval (None where it holds no
    rate), and what it held and how it ended. ``why`` and ``decision`` are the recommendation's: the
    words of its rule and the rule's record (:class:`~stagebench.model._evidence.Decision` as JSON)."""

    num_workers: int | None = None
    prefetch_factor: int | None = None
    #: True, False, or "not applicable" (:data:`stagebench.runs._knobs.NOT_APPLICABLE`)
    persistent_workers: bool | str | None = None
    pin_memory: bool | str | None = None
    samples_per_s: Rate | None = None
    batches_per_s: float | None = None
    mem_pss_mb: float | None = None
    mem_workers_mb: float | None = None
    cores_used: float | None = None
    time_to_first_batch_s: float | None = None
    epoch_stall_s: float | None = None
    #: the start-up split, as the point's row recorded it
    startup: StartupSplit = StartupSplit()
    #: how many readings the point pools
    measurements: int | None = None
    status: str = "ok"
    reason: str = ""
    why: str | None = None
    decision: Decision | None = None
    #: a ranked sweep: the host's ranks measured together (``samples_per_s`` is then the host's, their sum),
    #: and the slowest and fastest rank's samples/s; None on one rank
    ranks: int | None = None
    rank_min_samples_per_s: float | None = None
    rank_max_samples_per_s: float | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> LoaderPoint:
        """A point from a summary's dict, a normalised row or a DataFrame record (a knob read as a float
        there is a whole number here)."""
        return read(
            cls,
            d,
            {"samples_per_s": Rate.from_json(d), "startup": StartupSplit.from_json(d)},
            num_workers=whole,
            prefetch_factor=whole,
            persistent_workers=_knob_flag,
            pin_memory=_knob_flag,
            measurements=whole,
            ranks=whole,
            status=lambda v: str(v or "ok"),
            reason=lambda v: str(v or ""),
            why=text,
            decision=Decision.from_json,
            **dict.fromkeys(_POINT_NUMBERS, number),
        )

    @property
    def knobs(self) -> LoaderKnobs | None:
        """The setting the point ran, as the analysis keys it (:meth:`LoaderKnobs.from_row`: two points are
        one setting where these are equal); None where the point names no num_workers."""
        if self.num_workers is None:
            return None
        return LoaderKnobs.from_row({k: getattr(self, k) for k in KNOBS})

    @property
    def rate(self) -> float | None:
        """samples/s, None where unknown."""
        return None if self.samples_per_s is None else self.samples_per_s.value

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _row_flag(v: Any) -> bool | str:
    """True / False, or :data:`NOT_APPLICABLE` where the knob does not apply (NaN after a CSV round trip)."""
    if isinstance(v, bool):
        return v
    if isinstance(v, str):
        s = v.strip().lower()
        if s in ("true", "1", "yes"):
            return True
        if s in ("false", "0", "no"):
            return False
        return NOT_APPLICABLE
    try:
        if v is None or math.isnan(float(v)):
            return NOT_APPLICABLE
        return bool(v)
    except (TypeError, ValueError):
        return NOT_APPLICABLE


def _row_text(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return str(v)


#: A row's texts, as read ("" where empty).
_ROW_TEXTS = ("loader", "backend", "status", "reason", "search_phase", "started_at", "notes")
#: A ranked window's columns (:data:`stagebench.runs._schema.RANK_COLUMNS`).
_RANK_FIELDS = ("ranks", "rank_min_samples_per_s", "rank_max_samples_per_s")


@dataclass(frozen=True, slots=True)
class LoaderRow(Written):
    """One loader row of ``results.csv`` with Python types, or a setting's rows pooled into one point.

    The fields are the columns (:data:`stagebench.runs._schema.LOADER_COLUMNS`, in their order): a number
    is a float (NaN where the column is empty), a text is "" where empty, ``persistent_workers`` and
    ``pin_memory`` are True, False or :data:`NOT_APPLICABLE`. A ranked window's columns are None on one
    rank. A point pooled from several rows also holds ``measurements`` and ``readings``; the pick adds its
    ``why`` and the rule's ``decision``. Rows arrive as the sweep measured them or read back from CSV (where
    True became a string and an empty prefetch_factor NaN): :meth:`from_row` reads both the same way.
    """

    loader: str = ""
    backend: str = ""
    num_workers: int = 0
    prefetch_factor: int | None = None
    persistent_workers: bool | str = NOT_APPLICABLE
    pin_memory: bool | str = NOT_APPLICABLE
    status: str = "ok"
    reason: str = ""
    samples_per_s: float = math.nan
    samples_per_s_low: float = math.nan
    samples_per_s_high: float = math.nan
    batches_per_s: float = math.nan
    cv: float = math.nan
    time_to_first_batch_s: float = math.nan
    epoch_stall_s: float = math.nan
    n_batches: float = math.nan
    window_s: float = math.nan
    cores_used: float = math.nan
    mem_pss_mb: float = math.nan
    mem_uss_mb: float = math.nan
    mem_main_mb: float = math.nan
    mem_workers_mb: float = math.nan
    disk_read_mb_s: float = math.nan
    search_phase: str = ""
    started_at: str = ""
    elapsed_s: float = math.nan
    n_samples: float = math.nan
    workers_seen: float = math.nan
    worker_threads: float = math.nan
    startup_s: float = math.nan
    warmup_s: float = math.nan
    stall_phase_s: float = math.nan
    teardown_s: float = math.nan
    notes: str = ""
    turn: float = math.nan
    workers_start_s: float = math.nan
    workers_start_last_s: float = math.nan
    workers_created_s: float = math.nan
    worker_boot_s: float = math.nan
    worker_init_s: float = math.nan
    first_batch_work_s: float = math.nan
    first_delivery_s: float = math.nan
    worker_unsplit_s: float = math.nan
    ranks: int | None = None
    rank_min_samples_per_s: float | None = None
    rank_max_samples_per_s: float | None = None
    #: a pooled point: how many readings it pools, and their samples/s
    measurements: int | None = None
    readings: tuple[float, ...] | None = None
    #: the pick's: the words of its rule and the rule's record (:class:`~stagebench.model._evidence.Decision`)
    why: str | None = None
    decision: Decision | None = None

    #: a ranked window's columns, and what a pooled point and a pick add, are written where they hold something
    OPTIONAL = frozenset((*_RANK_FIELDS, "measurements", "readings", "why", "decision"))

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> LoaderRow:
        """A row as measured, or as a DataFrame record read back from CSV: ints, floats (NaN where
        missing), True/False/:data:`NOT_APPLICABLE`; the rank columns None where the row holds no ranks."""
        nw, pf, ranks = num(row.get("num_workers")), num(row.get("prefetch_factor")), num(row.get("ranks"))
        kw: dict[str, Any] = {name: num(row.get(name)) for name in _ROW_NUMBERS}
        kw.update({name: _row_text(row.get(name)) for name in _ROW_TEXTS})
        kw["status"] = kw["status"] or "ok"
        if math.isfinite(ranks):  # a ranked window's; a row of one process holds none (as rows before ranks)
            kw.update(
                ranks=int(ranks),
                rank_min_samples_per_s=num(row.get("rank_min_samples_per_s")),
                rank_max_samples_per_s=num(row.get("rank_max_samples_per_s")),
            )
        return cls(
            num_workers=int(nw) if math.isfinite(nw) else 0,
            prefetch_factor=int(pf) if math.isfinite(pf) else None,
            persistent_workers=_row_flag(row.get("persistent_workers")),
            pin_memory=_row_flag(row.get("pin_memory")),
            **kw,
        )

    @property
    def knobs(self) -> LoaderKnobs:
        """The setting the row ran (:meth:`LoaderKnobs.from_row`: two rows are one setting where these are equal)."""
        return LoaderKnobs.from_row({k: getattr(self, k) for k in KNOBS})

    def pick_json(self, *, with_why: bool = False) -> dict[str, Any]:
        """The row as ``summary.json`` holds a pick (``recommended``, ``best``, ``user_setting``): its knobs
        and measurements (:data:`PICK_KEYS`), its ``why`` (``with_why``, where it has one) and the rule's
        record it rests on (:class:`~stagebench.model._evidence.Decision`)."""
        out: dict[str, Any] = {k: getattr(self, k) for k in PICK_KEYS}
        if with_why and self.why is not None:
            out["why"] = self.why
        if self.decision is not None:
            out["decision"] = self.decision.to_json()
        return out

    @property
    def startup(self) -> StartupSplit:
        """The start-up split, as the row recorded it."""
        return StartupSplit(**{key: getattr(self, key) for key in STARTUP_KEYS})

    @property
    def rate(self) -> Rate | None:
        """samples/s with its interval, read by :meth:`Rate.from_json`'s rules; None where the row holds no rate."""
        return Rate.of(self.samples_per_s, self.samples_per_s_low, self.samples_per_s_high)

    @property
    def ok(self) -> bool:
        """Measured ok, with a positive rate."""
        return self.status == "ok" and math.isfinite(self.samples_per_s) and self.samples_per_s > 0

    @property
    def stall_unmeasured(self) -> str | None:
        """Why the row's epoch stall, asked for, was not measured (its note after :data:`STALL_NOT_MEASURED`);
        None where its notes say no such thing."""
        for note in self.notes.split(_NOTE_SEP):
            if note.startswith(STALL_NOT_MEASURED):
                return note.removeprefix(STALL_NOT_MEASURED)
        return None


#: What ``summary.json`` holds of a pick (:meth:`LoaderRow.pick_json`), in order.
PICK_KEYS = (
    *KNOBS,
    "samples_per_s",
    "samples_per_s_low",
    "samples_per_s_high",
    "batches_per_s",
    "mem_pss_mb",
    "cores_used",
    "time_to_first_batch_s",
    "epoch_stall_s",
)
#: The columns, in their order, as :class:`LoaderRow` declares them.
_ROW_COLUMNS = tuple(f.name for f in dataclass_fields(LoaderRow))[
    : -len(("measurements", "readings", "why", "decision"))
]
#: The columns that hold a number (a float, NaN where empty).
_ROW_NUMBERS = tuple(name for name in _ROW_COLUMNS if name not in (*_ROW_TEXTS, *_RANK_FIELDS, *KNOBS))


class _Record(ReadIfGiven):
    """A record of what each worker costs, read from any mapping (an empty one too, as its defaults);
    None only where there is no mapping."""

    __slots__ = ()

    @classmethod
    def holds(cls, d: object) -> bool:
        return True


@dataclass(frozen=True, slots=True)
class Largest(_Record):
    """The dataset's largest container attribute: its name, length, type, its items' type, whether they
    are Python objects (not a numpy array's), and the memory those objects take (MB)."""

    attr: str | None = None
    items: int | None = None
    container: str | None = None
    item: str | None = None
    python_objects: bool | None = None
    objects_mb: float | None = None

    READ = {"attr": text, "items": whole, "container": text, "item": text, "python_objects": flag, "objects_mb": number}


@dataclass(frozen=True, slots=True)
class Shipping(_Record):
    """The dataset (with the collate and init functions) shipped to each worker: the start method,
    whether anything is shipped (not under fork), whether SPDL's loader pickles it once for all, and, where
    it pickled, its size (MB) and the medians (with their ranges) of pickling and loading it (s)."""

    start_method: str | None = None
    shipped: bool | None = None
    pickled_once: bool | None = None
    largest: Largest | None = None
    #: why the dataset could not be pickled
    error: str | None = None
    mb: float | None = None
    pickle_s: float | None = None
    pickle_s_range: tuple[float, ...] | None = None
    unpickle_s: float | None = None
    unpickle_s_range: tuple[float, ...] | None = None
    repeats: int | None = None

    READ = {
        "start_method": text,
        "shipped": flag,
        "pickled_once": flag,
        "largest": Largest.from_json,
        "pickle_s_range": span,
        "unpickle_s_range": span,
        "repeats": whole,
        "error": text,
        **dict.fromkeys(("mb", "pickle_s", "unpickle_s"), number),
    }

    #: written as :func:`stagebench.loader._costs.shipping_cost` writes them: where it pickled, its figures
    OPTIONAL = frozenset(
        {"pickled_once", "error", "mb", "pickle_s", "pickle_s_range", "unpickle_s", "unpickle_s_range", "repeats"}
    )


@dataclass(frozen=True, slots=True)
class MemorySample(Read):
    """One reading of the memory pass: seconds into it, each worker's private memory (MB) and the batches
    each worker had made, by worker (its pid; a string once read back from JSON)."""

    t: float = 0.0
    uss_mb: Mapping[Any, float] = field(default_factory=dict)
    batches: Mapping[Any, int] = field(default_factory=dict)

    READ = {"t": lambda v: float(v or 0.0), "uss_mb": dict_of, "batches": dict_of}


def _samples(v: Any) -> tuple[MemorySample, ...] | None:
    return (
        None if not isinstance(v, Sequence) else tuple(MemorySample.from_json(s) for s in v if isinstance(s, Mapping))
    )


#: :class:`WorkerMemory`'s figures, each a number as written
_MEMORY_NUMBERS = (
    "growth_mb_per_batch",
    "growth_mb_per_batch_low",
    "growth_mb_per_batch_high",
    "batches_per_worker",
    "epoch_batches_per_worker",
    "start_mb",
    "end_mb",
    "epoch_growth_mb",
    "epoch_growth_mb_low",
    "epoch_growth_mb_high",
    "bounded_by_mb",
    "seconds",
    "all_workers_mb",
)


#: the epoch's growth and what goes with it, written together
_EPOCH_GROUP = ("epoch_growth_mb", "epoch_growth_mb_low", "epoch_growth_mb_high", "extrapolated", "bounded_by_mb")


@dataclass(frozen=True, slots=True)
class WorkerMemory(_Record):
    """Each worker's private memory over the memory pass at ``num_workers``: its growth a batch (with a 95%
    interval), how many batches a worker made and makes in an epoch, and the epoch's growth (extrapolated
    where the pass ended first, bounded by ``bounded_by_mb``); ``too_few_batches`` where a worker made too
    few to extrapolate, ``stopped_growing`` where the pass's second half showed no growth beyond noise,
    ``slowing`` where every reading grew but the second half at under half the first's rate (a copy-on-read).
    ``all_workers_mb`` and ``fits``: the summary's, against the memory available; ``workers_fit``: under a
    cgroup's memory limit, how many such workers its room holds over an epoch."""

    num_workers: int | None = None
    samples: tuple[MemorySample, ...] | None = None
    growth_mb_per_batch: float | None = None
    growth_mb_per_batch_low: float | None = None
    growth_mb_per_batch_high: float | None = None
    batches_per_worker: float | None = None
    epoch_batches_per_worker: float | None = None
    start_mb: float | None = None
    end_mb: float | None = None
    too_few_batches: bool | None = None
    epoch_growth_mb: float | None = None
    epoch_growth_mb_low: float | None = None
    epoch_growth_mb_high: float | None = None
    extrapolated: bool | None = None
    slowing: bool | None = None
    bounded_by_mb: float | None = None
    stopped_growing: bool | None = None
    #: what the pass took (s)
    seconds: float | None = None
    all_workers_mb: float | None = None
    fits: bool | None = None
    #: a ranked sweep: the host's ranks, each with as many workers growing alike (``all_workers_mb`` is all of
    #: theirs, ``workers_fit`` a rank's); None on one rank
    ranks: int | None = None
    workers_fit: int | None = None

    READ = {
        "num_workers": whole,
        "samples": _samples,
        **dict.fromkeys(("too_few_batches", "stopped_growing", "slowing", "extrapolated", "fits"), flag),
        "workers_fit": whole,
        "ranks": whole,
        **dict.fromkeys(_MEMORY_NUMBERS, number),
    }
    #: written as the memory pass and the summary write them: the epoch's growth with its interval, whether
    #: extrapolated and its bound (None too) as one group, the memory in all with whether it fits as another
    OPTIONAL = frozenset(("samples", "too_few_batches", *_EPOCH_GROUP, "slowing", "stopped_growing", "seconds"))
    OPTIONAL |= {"all_workers_mb", "fits", "ranks", "workers_fit"}
    BESIDE = {**dict.fromkeys(_EPOCH_GROUP, "epoch_growth_mb"), "all_workers_mb": "fits", "fits": "all_workers_mb"}


@dataclass(frozen=True, slots=True)
class Shm(_Record):
    """The shared memory (``path``, ``/dev/shm``) the batches in flight at the pick take: how many
    (``num_workers x prefetch_factor``, every rank's), each batch's size, together, against the space free and
    in all (MB)."""

    path: str | None = None
    free_mb: float | None = None
    total_mb: float | None = None
    batch_mb: float | None = None
    batches_in_flight: int | None = None
    in_flight_mb: float | None = None
    #: a ranked sweep: the host's ranks, every rank's batches in flight counted; None on one rank
    ranks: int | None = None

    READ = {
        "path": text,
        "batches_in_flight": whole,
        "ranks": whole,
        **dict.fromkeys(("free_mb", "total_mb", "batch_mb", "in_flight_mb"), number),
    }
    OPTIONAL = frozenset({"ranks"})


@dataclass(frozen=True, slots=True)
class WorkerCosts(Read):
    """What each worker costs beyond throughput (``summary.json["worker_costs"]``, module docstring): the
    start-up split per number of workers, the memory available (MB), the shipping, the memory pass and the
    shared memory (each None where not measured), and what measuring them added to the sweep (s)."""

    startup: tuple[StartupSplit, ...] = ()
    available_mb: float | None = None
    #: the cgroup memory limit that set ``available_mb`` (None: the host's available memory did)
    memory_limit: MemoryLimit | None = None
    shipping: Shipping | None = None
    #: the memory pass ran during the stall point (its seconds are then that row's)
    memory_on_stall_point: bool | None = None
    memory: WorkerMemory | None = None
    shm: Shm | None = None
    seconds: float | None = None

    READ = {
        "startup": lambda v: tuple(StartupSplit.from_json(r) for r in v or () if isinstance(r, Mapping)),
        "available_mb": number,
        "memory_limit": given(MemoryLimit.from_json),
        "shipping": Shipping.from_json,
        "memory": WorkerMemory.from_json,
        "shm": Shm.from_json,
        "memory_on_stall_point": flag,
        "seconds": number,
    }
    #: what was measured, as the sweep wrote it, after the start-up split (the summary's ``worker_costs``)
    OPTIONAL = frozenset(
        {"available_mb", "memory_limit", "shipping", "memory_on_stall_point", "memory", "shm", "seconds"}
    )
