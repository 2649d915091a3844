"""The training job's runs and their verdict: the user's loop on the real loader or pipeline at a few settings.

Three records, read from JSON once and then by attribute:

* :class:`StepAlone`: the user's step alone on cached batches (``run.json["trainer"]``, and
  ``summary.json["trainer"]`` with the job at the pick beside it): the demand on the loading.
* :class:`JobRecord`: what the job runs measured (``run.json["job"]``, written by
  :meth:`stagebench.core._jobrun.JobRuns.record`): the candidates, and every slice's waits and bodies.
* :class:`JobVerdict`: what the analysis made of them (``summary.json["job"]``,
  :func:`stagebench.analysis._job.decide_job`): each candidate with its pooled figures
  (:class:`JobFigures`) and its ratio to yours in turns, the rule's :class:`Decision`, the pick.

Why the rates are kept as the three numbers the rows hold (``samples_per_s``, ``_low``, ``_high``)
besides :attr:`JobFigures.rate`: the report prints the interval as stored, and a row whose interval
:class:`Rate` would refuse (written before the log-scale interval) must read as it always has.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from stagebench.model._evidence import Decision, Ratio
from stagebench.model._json import Coercions, Read, ReadIfGiven, dict_of, each, items, read, texts, write
from stagebench.model._rate import Rate

__all__ = ["StepAlone", "JobFigures", "JobCandidate", "JobSlice", "JobSkipped", "JobRecord", "JobVerdict"]


@dataclass(frozen=True, slots=True)
class JobFigures(ReadIfGiven):
    """One candidate's job figures, pooled over its slices: the rate (per item, with its interval), the
    share of each step spent waiting for the batch, the loop body's own rate next to the loader, and the
    rate of each round it ran in (what the comparisons in turns pair up). A candidate whose slices all
    failed holds only ``failed``."""

    samples_per_s: float | None = None
    samples_per_s_low: float | None = None
    samples_per_s_high: float | None = None
    data_wait_share: float | None = None
    step_samples_per_s: float | None = None
    """The loop body alone, next to the loader (None: no body time)."""
    steps: int | None = None
    seconds: float | None = None
    slices: int | None = None
    groups: int | None = None
    startup_s: float | None = None
    failed: tuple[str, ...] = ()
    """Why each failed slice failed."""
    round_rates: Mapping[str, float] = field(default_factory=dict)
    """Per round (its number as a string): the candidate's slice rate in it."""

    READ: ClassVar[Coercions] = {"failed": texts, "round_rates": dict_of}

    @property
    def rate(self) -> Rate | None:
        return Rate.of(self.samples_per_s, self.samples_per_s_low, self.samples_per_s_high)


@dataclass(frozen=True, slots=True)
class StepAlone(Read):
    """The user's training step alone on cached batches (:class:`stagebench.core._steps.TrainerProbe`):
    its rate per step and per item with their intervals, how it was measured, and, in the summary, the job
    at the pick beside it (``with_pipeline``). Every field is None where the rows do not hold it."""

    steps_per_s: float | None = None
    steps_per_s_low: float | None = None
    steps_per_s_high: float | None = None
    items_per_step: float | None = None
    samples_per_s: float | None = None
    samples_per_s_low: float | None = None
    samples_per_s_high: float | None = None
    steps: int | None = None
    seconds: float | None = None
    warmup_steps: int | None = None
    precision: float | None = None
    stopped_by: str | None = None
    pinned: Any = None
    error: str | None = None
    stopped_early: str | None = None
    with_pipeline: JobFigures | None = None
    """The job at the pick (steps, seconds, data wait, rate); None where the job did not decide."""

    READ: ClassVar[Coercions] = {"with_pipeline": JobFigures.from_json}

    @property
    def rate(self) -> Rate | None:
        """Items per second, with its interval (None: not measured)."""
        return Rate.of(self.samples_per_s, self.samples_per_s_low, self.samples_per_s_high)

    def as_run(self) -> dict[str, Any]:
        """The step as ``run.json["trainer"]`` holds it: without the job at the pick (the summary adds it)."""
        out = self.to_json()
        del out["with_pipeline"]
        return out

    @property
    def unmeasured_why(self) -> str:
        """Why the step has no rate, in words: its loop stopped early, it failed, or neither was recorded."""
        return self.stopped_early or self.error or "its step was not measured"

    def to_json(self) -> dict[str, Any]:
        """The fields in order; the job at the pick as the summary holds it (its steps, seconds, data wait
        and rate)."""
        out = write(self)
        if self.with_pipeline is not None:
            out["with_pipeline"] = {k: getattr(self.with_pipeline, k) for k in _WITH_PIPELINE}
        return out


#: what the summary keeps of the job at the pick beside the step alone
_WITH_PIPELINE = ("steps", "seconds", "data_wait_share", "samples_per_s")


@dataclass(frozen=True, slots=True)
class JobCandidate:
    """A setting run with the user's loop: its key and words, its knobs (per kind: the loader's keyword
    arguments, or each stage's executor and concurrency), why it was run (``origin``), its cost (workers
    first), its rate alone; in the verdict also its job figures, its ratio to yours in turns and whether it
    was shown as good as the fastest."""

    key: str
    label: str | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)
    origin: tuple[str, ...] = ()
    cost: tuple[float, ...] = ()
    round_steps: int | None = None
    group_steps: int = 1
    """Steps per group: a whole round of the workers (what a rate's interval is built from)."""
    alone: Rate | None = None
    """The loader or pipeline alone at this setting (None: not measured alone)."""
    alone_as: str | None = None
    """The setting the alone figure was measured at, where another (``alone["measured_as"]``)."""
    job: JobFigures | None = None
    """None where it did not run with the loop."""
    versus_yours: Ratio | None = None
    as_good: bool = False

    @property
    def name(self) -> str:
        """The label, else the key."""
        return self.label or self.key

    @property
    def in_step(self) -> bool:
        """A loader setting with no worker: the loading runs in the training process itself
        (:attr:`stagebench.model._evidence.Option.in_step`)."""
        return self.settings.get("num_workers") == 0

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> JobCandidate:
        return read(
            cls,
            d,
            {"key": d["key"], "alone_as": (d.get("alone") or {}).get("measured_as")},
            settings=dict_of,
            origin=items,
            cost=lambda v: tuple(float(x) for x in v or ()),
            group_steps=lambda v: int(v or 1),
            alone=Rate.from_json,
            job=JobFigures.from_json,
            versus_yours=Ratio.from_json,
            as_good=bool,
        )

    def to_json(self) -> dict[str, Any]:
        """The fields in order, the setting the alone figure was measured at inside ``alone``."""
        out = write(self)
        del out["alone_as"]
        if self.alone is not None and self.alone_as is not None:
            out["alone"]["measured_as"] = self.alone_as
        return out

    def as_run(self) -> dict[str, Any]:
        """The candidate as ``run.json["job"]`` holds it: what was run, without the verdict's figures."""
        out = self.to_json()
        for k in _VERDICT_ONLY:
            del out[k]
        return out


#: what the verdict adds to a candidate (its figures, its ratio to yours, whether as good as the fastest)
_VERDICT_ONLY = ("job", "versus_yours", "as_good")


@dataclass(frozen=True, slots=True)
class JobSlice(Read):
    """One candidate's turn in one round: each counted step's wait for its batch and its loop body, in
    seconds; a failed slice holds why."""

    candidate: str | None = None
    round: int = 0
    status: str | None = None
    reason: str | None = None
    startup_s: float | None = None
    """Seconds from opening the loader to its first batch (None: resumed, or no batch came)."""
    resumed: bool = False
    """Whether the loader was kept open from an earlier turn."""
    drained: int = 0
    """Batches a resumed loader had queued while it waited, taken before the warm-up."""
    warmup_steps: int = 0
    partial: bool = False
    """Whether the user's loop stopped inside the slice."""
    wall_s: float = 0.0
    """Seconds the slice took, its opening included."""
    emptied: int | None = None
    """Items a pipeline dropped as its turn ended (None: a loader, or not kept open; not written)."""
    waits: tuple[float, ...] = ()
    bodies: tuple[float, ...] = ()

    READ: ClassVar[Coercions] = {
        "round": lambda v: int(v or 0),
        "waits": items,
        "bodies": items,
        "wall_s": lambda v: float(v or 0.0),
    }
    OPTIONAL = frozenset({"emptied"})


@dataclass(frozen=True, slots=True)
class JobSkipped(Read):
    """A setting the ladder offered but did not run with the loop, and why."""

    label: str
    why: str


@dataclass(frozen=True, slots=True)
class JobRecord(Read):
    """What the job runs measured (``run.json["job"]``, built by
    :meth:`stagebench.core._jobrun.JobRuns.record`): the items per step, the candidates, those ruled out,
    every slice, how the runs were bounded, how long they ran and why they stopped, and the host's load
    meanwhile."""

    items_per_step: float = 1.0
    candidates: tuple[JobCandidate, ...] = ()
    skipped: tuple[JobSkipped, ...] = ()
    slices: tuple[JobSlice, ...] = ()
    rounds: int | None = None
    max_rounds: int | None = None
    budget_s: float | None = None
    max_slice_s: float | None = None
    keep_open: bool = True
    """Whether the loaders stayed open between their turns."""
    settled: bool = False
    seconds: float | None = None
    steps_handed: int | None = None
    stopped: str | None = None
    what: str | None = None
    load_avg: tuple[float | None, ...] = ()
    """The host's 1-min load at the start and the end of the runs (None where the host did not say)."""
    cores: int = 0

    READ: ClassVar[Coercions] = {
        "candidates": each(JobCandidate.from_json),
        "slices": each(JobSlice.from_json),
        "items_per_step": lambda v: float(v or 1.0),
        "load_avg": lambda v: tuple(x for x in v or () if x is None or isinstance(x, (int, float))),
        "cores": lambda v: int(v or 0),
        "skipped": each(JobSkipped.from_json),
    }

    def to_json(self) -> dict[str, Any]:
        """``run.json["job"]``: the fields in order, each candidate as run (:meth:`JobCandidate.as_run`)."""
        out = write(self)
        out["candidates"] = [c.as_run() for c in self.candidates]
        return out


@dataclass(frozen=True, slots=True)
class JobVerdict(ReadIfGiven):
    """The job's verdict (``summary.json["job"]``): each candidate with its figures, the rule's
    :class:`Decision`, and what it comes to: ``status`` (``decided`` or ``not run``), the pick and its
    rate, ``advice``, ``bound`` (what sets the job's pace), what was not checked, the words. The loader's
    adds ``zero_workers`` (why num_workers=0 was or was not chosen), the pipeline's ``changed`` (the
    stages the pick changed)."""

    candidates: tuple[JobCandidate, ...] = ()
    demand: float | None = None
    """Items per second of the step alone (None: not measured)."""
    rounds: int | None = None
    seconds: float | None = None
    steps_handed: int | None = None
    stopped: str | None = None
    yours: str | None = None
    unit: str | None = None
    what: str | None = None
    decision: Decision | None = None
    status: str | None = None
    pick: str | None = None
    best: str | None = None
    as_good: tuple[str, ...] = ()
    advice: str | None = None
    why: str | None = None
    bound: str | None = None
    samples_per_s: float | None = None
    samples_per_s_low: float | None = None
    samples_per_s_high: float | None = None
    data_wait_share: float | None = None
    unproven: tuple[str, ...] = ()
    text: str | None = None
    zero_workers: str | None = None
    changed: tuple[str, ...] = ()
    keys: tuple[str, ...] = field(default=(), compare=False, repr=False)
    """The keys it was built or read with, in order: ``to_json`` writes those (a loader's verdict has no
    ``changed``, a pipeline's no ``zero_workers``, one that did not run no rate)."""
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    READ: ClassVar[Coercions] = {
        "candidates": each(JobCandidate.from_json),
        "decision": Decision.from_json,
        "as_good": items,
        "unproven": items,
        "changed": items,
    }

    @property
    def decided(self) -> bool:
        return self.status == "decided"

    @property
    def picked(self) -> JobCandidate | None:
        """The pick's candidate (None: no pick, or not among the candidates)."""
        return next((c for c in self.candidates if c.key == self.pick), None)
