"""One stage of a pipeline summary, typed: its status, settings, GIL estimate, label and limit.

A pipeline's ``summary.json`` holds one entry per stage (``summary["stages"]``), built by
:func:`stagebench.analysis._stage.analyze_stage` and extended by the pipeline's analysis (index, type,
the setting chosen together with the other stages). The findings, the pipeline's prediction, the fused
stages' split and the report all read the same entry: :class:`StageEntry` is that entry read once, so
that every reader sees the same defaults for a key an older summary lacks, and a misspelt key fails
at the type check instead of reading ``None``.

Every type keeps the keys its dict held, in their order, and the keys it does not know, so that
``to_json`` gives back the dict it was read from: the summary on disk does not change by being read.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from stagebench.model._json import Coercions, Read, ReadIfGiven, items

__all__ = [
    "GilEstimate",
    "HeadToHead",
    "PageFaults",
    "StageEntry",
    "StageEvidence",
    "StageLimit",
    "StageSetting",
    "changed",
    "keyed",
    "own_choice",
]

_T = TypeVar("_T")


def keyed(cls: type[_T], **values: Any) -> _T:
    """A ``cls`` built where it is made, its ``keys`` the fields given, in their order.

    Args:
        cls: a type of this module (it keeps ``keys``, so ``to_json`` writes those keys alone).
        values: its fields, in the order its dict lists them.

    Returns:
        The ``cls``, whose ``to_json`` gives ``values`` as JSON holds them.
    """
    return cls(**values, keys=tuple(values))  # type: ignore[call-arg]  # every type here has a ``keys`` field


def changed(obj: _T, **values: Any) -> _T:
    """``obj`` with ``values`` set, as a dict's keys are set: a key it lacked is listed after its own.

    Args:
        obj: a dataclass that keeps ``keys`` (built by :func:`keyed` or read).
        values: the fields to set.

    Returns:
        A new ``obj``; ``obj`` itself is not changed.
    """
    keys: tuple[str, ...] = obj.keys  # type: ignore[attr-defined]  # every type built so keeps ``keys``
    new = tuple(k for k in values if k not in keys)
    return dataclasses.replace(obj, **values, keys=keys + new)  # type: ignore[type-var]  # a dataclass of this package


def _signal_value(signals: Mapping[str, Any], name: str) -> Any:
    """The ``value`` of the signal ``name`` (None where it was not read)."""
    sig = signals[name] if name in signals else None
    return sig["value"] if isinstance(sig, Mapping) and "value" in sig else None


def own_choice(executor: Any, concurrency: Any, kind: Any) -> tuple[str, int] | None:
    """A pipe stage's own (executor, concurrency) in the user's config, or None (not a pipe, not known).

    SPDL's shared thread pool (``default``) counts as threads: at equal concurrency the recommendation
    and the user's setting run the stage on the same number of threads.

    Args:
        executor: the user's executor (``user_executor``), None where not known.
        concurrency: the user's concurrency (``user_concurrency``).
        kind: the stage's declared type (None: a pipe).

    Returns:
        ``(executor, concurrency)``, or None.
    """
    if not executor or concurrency is None or (kind or "pipe") != "pipe":
        return None
    return ("thread" if executor == "default" else str(executor), int(concurrency))


@dataclass(frozen=True, slots=True)
class StageSetting(ReadIfGiven):
    """A setting of one stage (an executor at a concurrency, in a harness) and what it measured there.

    The entry's ``recommended``, ``best``, ``recommended_alone`` and each of its ``alternatives`` are
    one; so is each point of its ``curves`` (those have no executor or harness: their curve's key says
    them). ``why`` is the recommendation's reason; the CPU and GIL times are an alternative's.
    """

    executor: str | None = None
    concurrency: int | None = None
    qps: float | None = None
    qps_low: float | None = None
    qps_high: float | None = None
    harness: str | None = None
    why: str | None = None
    cpu_s_per_item: float | None = None
    call_cpu_s: float | None = None
    gc_s_per_item: float | None = None
    gc_full_s_per_item: float | None = None
    gc_young_per_item: float | None = None
    harness_gil_s_per_item: float | None = None
    #: a process alternative's: the main process's cost of moving an item to a worker and back, beyond
    #: what the thread harness costs (None: not a process setting, or no pair of ceilings read)
    ipc_s_per_item: float | None = None
    cores_used: float | None = None
    latency_p50_ms: float | None = None
    keys: tuple[str, ...] = field(default=(), compare=False, repr=False)
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)


def _interval(v: Any) -> Any:
    """An interval as a tuple; anything but a list kept as read."""
    return tuple(v) if isinstance(v, (list, tuple)) else v


def _or_empty(v: Any) -> Any:
    return v or {}


def _false_if_none(v: Any) -> Any:
    return False if v is None else v


def _per_input(v: Any) -> float:
    """``items_per_input``: 1.0 where it is None, 0 or no number (as every reader took it)."""
    try:
        return float(v or 1.0)
    except (TypeError, ValueError):
        return 1.0


def _curves(v: Any) -> dict[str, tuple[StageSetting, ...]]:
    return {
        str(c): tuple(StageSetting.from_json(p) or StageSetting(keys=tuple(p or ())) for p in pts or ())
        for c, pts in (v or {}).items()
    }


def _settings(d: Any) -> dict[str, StageSetting]:
    return {str(k): StageSetting.from_json(v) or StageSetting(keys=tuple(v or ())) for k, v in (d or {}).items()}


@dataclass(frozen=True, slots=True)
class PageFaults(Read):
    """The minor page faults one executor's points took: ``per_item`` (per call, over its points), with
    the CPU per item they were read beside and how many ``points`` they rest on."""

    per_item: float | None = None
    cpu_s_per_item: float | None = None
    points: int | None = None
    keys: tuple[str, ...] = field(default=(), compare=False, repr=False)
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class HeadToHead(ReadIfGiven):
    """Threads against processes measured in turns (:func:`stagebench.core._paired.paired_result`).

    ``decisive``: enough pairs to decide; ``ratio``: processes' throughput over threads', with its 95%
    interval; ``thread`` and ``process``: the two settings and their mean throughput over the pairs;
    ``windows``: the windows measured, usable or not.
    """

    decisive: bool = False
    processes_win: bool = False
    ratio: float | None = None
    ratio_low: float | None = None
    ratio_high: float | None = None
    pairs: int = 0
    harness: str | None = None
    windows: int = 0
    thread: StageSetting | None = None
    process: StageSetting | None = None
    keys: tuple[str, ...] = field(default=(), compare=False, repr=False)
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    READ: ClassVar[Coercions] = {"thread": StageSetting.from_json, "process": StageSetting.from_json}


@dataclass(frozen=True, slots=True)
class StageLimit(ReadIfGiven):
    """What holds the stage back at its best setting: ``kind`` (None: nothing stands out), the setting
    it was read at (``at``, ``thread x 4``) and the phrase that says it (``text``)."""

    kind: str | None = None
    at: str | None = None
    text: str | None = None
    keys: tuple[str, ...] = field(default=(), compare=False, repr=False)
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class GilEstimate(ReadIfGiven):
    """A stage's GIL share and how it was read (:func:`stagebench.analysis._gil.estimate_gil`).

    ``fraction`` and its ``interval`` (None where no thread or event-loop point was measured);
    ``pinned`` (False where the curves only bound it); ``source`` (``"probe"`` where a counter thread's
    reading decided); the stage's own GIL and wall seconds per item; ``saturated`` (the thread curve
    flattened below the cores) and what serialises it (``serializer``: ``"gil"``, ``"other"``); the
    curve it was read on (``harness``, ``executor``); the ``signals`` behind it and ``notes`` in words.
    A stage entry keeps a part of it under ``gil`` (without the figures the entry holds itself),
    with ``releases_per_call``.
    """

    fraction: float | None = None
    interval: tuple[float, ...] | None = None
    pinned: bool = False
    source: str | None = None
    gil_s_per_item: float | None = None
    stage_s_per_item: float | None = None
    saturated: bool = False
    serializer: str | None = None
    harness: str | None = None
    executor: str | None = None
    signals: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    releases_per_call: float | None = None
    keys: tuple[str, ...] = field(default=(), compare=False, repr=False)
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    READ: ClassVar[Coercions] = {
        "interval": _interval,
        "notes": items,
        "signals": _or_empty,
        "pinned": _false_if_none,
        "saturated": _false_if_none,
    }

    def signal_value(self, name: str) -> Any:
        """The value of the signal ``name`` (None where it was not read)."""
        return _signal_value(self.signals, name)


@dataclass(frozen=True, slots=True)
class StageEvidence(Read):
    """What a stage's label, limit and recommendation rest on: ``summary``, the lines the report lists,
    and ``signals``, every figure read on the way by name (each a dict with its ``value``, ``interval``,
    ``label`` and, where it decided something, ``role``)."""

    summary: tuple[str, ...] = ()
    signals: Mapping[str, Any] = field(default_factory=dict)
    keys: tuple[str, ...] = field(default=(), compare=False, repr=False)
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    READ: ClassVar[Coercions] = {"summary": items, "signals": _or_empty}

    def signal_value(self, name: str) -> Any:
        """The value of the signal ``name`` (None where it was not read)."""
        return _signal_value(self.signals, name)


@dataclass(frozen=True, slots=True)
class StageEntry(Read):
    """One stage's entry of a pipeline summary (``summary["stages"]``).

    ``status`` and ``reason`` say whether it measured; ``classification`` (its label), ``mix`` and
    ``limit`` what it is and what holds it back; ``recommended`` the setting the pipeline runs it at
    (``recommended_alone``: its own best alone, where the pipeline's differs; ``recommended_isolated``:
    the sweep's choice, where a job run chose another); ``best`` and ``alternatives`` (each executor's
    best) what it reached alone; the GIL share and the per-item times; the curves it was read from.
    ``items_per_input`` (an aggregate's or disaggregate's items per input item), ``is_async``, the
    user's own setting and the declared ``type`` come from ``run.json``.
    """

    name: str = ""
    index: int | None = None
    type: str | None = None
    status: str | None = None
    reason: str = ""
    classification: str | None = None
    mix: tuple[str, ...] = ()
    limit: StageLimit | None = None
    gil_fraction: float | None = None
    gil_fraction_interval: tuple[float, ...] | None = None
    evidence: StageEvidence = field(default_factory=StageEvidence)
    fit: Mapping[str, Any] = field(default_factory=dict)
    recommended: StageSetting | None = None
    recommended_alone: StageSetting | None = None
    recommended_isolated: StageSetting | None = None
    best: StageSetting | None = None
    ceiling_qps: float | None = None
    cpu_s_per_item: float | None = None
    gil_s_per_item: float | None = None
    harness: str | None = None
    stage_s_per_item: float | None = None
    harness_gil_s_per_item: float | None = None
    alternatives: Mapping[str, StageSetting] = field(default_factory=dict)
    head_to_head: HeadToHead | None = None
    head_to_head_skipped: str | None = None
    gil: GilEstimate | None = None
    problems: tuple[str, ...] = ()
    levels_measured: Mapping[str, Sequence[int]] = field(default_factory=dict)
    curves: Mapping[str, tuple[StageSetting, ...]] = field(default_factory=dict)
    payload_bytes: float | None = None
    page_faults: Mapping[str, PageFaults] = field(default_factory=dict)
    is_async: bool = False
    items_per_input: float = 1.0
    user_executor: str | None = None
    user_concurrency: int | None = None
    fused_chain: tuple[str, ...] = ()
    keys: tuple[str, ...] = field(default=(), compare=False, repr=False)
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    #: a missing key reads as its field's default (``items_per_input``: 1.0 also where it is None or 0)
    READ: ClassVar[Coercions] = {
        "limit": StageLimit.from_json,
        "gil": GilEstimate.from_json,
        "evidence": StageEvidence.from_json,
        "head_to_head": HeadToHead.from_json,
        "alternatives": _settings,
        "curves": _curves,
        "gil_fraction_interval": _interval,
        "page_faults": lambda v: {str(ex): PageFaults.from_json(x) for ex, x in (v or {}).items()},
        "items_per_input": _per_input,
        "is_async": bool,
        "reason": lambda v: "" if v is None else v,
        **dict.fromkeys(("recommended", "recommended_alone", "recommended_isolated", "best"), StageSetting.from_json),
        **dict.fromkeys(("mix", "problems", "fused_chain"), items),
        **dict.fromkeys(("fit", "levels_measured"), _or_empty),
    }

    @classmethod
    def empty(cls, name: str) -> StageEntry:
        """The entry of the stage ``name`` before anything is read into it, every key in ``summary.json``'s order:
        what :func:`stagebench.analysis._stage.analyze_stage` fills, and the fallback summary reports as it is."""
        return keyed(
            cls,
            name=name,
            index=None,
            type=None,
            status="ok",
            reason="",
            classification="unknown",
            limit=None,
            gil_fraction=None,
            gil_fraction_interval=None,
            evidence=keyed(StageEvidence, summary=(), signals={}),
            fit={},
            recommended=None,
            best=None,
            ceiling_qps=None,
            cpu_s_per_item=None,
            gil_s_per_item=None,
            harness=None,
            stage_s_per_item=None,
            harness_gil_s_per_item=None,
            alternatives={},
            head_to_head=None,
            gil=None,
            problems=(),
            levels_measured={},
            curves={},
            payload_bytes=None,
            page_faults={},
        )

    @property
    def ok(self) -> bool:
        """Whether the stage measured (an entry without a status counts as measured, as readers took it)."""
        return self.status == "ok" or (self.status is None and "status" not in self.keys)

    @property
    def gil_only_bounded(self) -> tuple[float, float] | None:
        """The GIL share's interval where the curves only bound it (``gil.pinned`` false), else None: its
        midpoint is then a guess. Tables show its upper end, the replay's stand-in its lower end."""
        g, iv = self.gil, self.gil_fraction_interval
        if g is None or "pinned" not in g.keys or g.pinned or not iv or len(iv) < 2:
            return None
        lo, hi = iv[0], iv[1]
        if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in (lo, hi)):
            return None
        return float(lo), float(hi)

    @property
    def gil_unread(self) -> bool:
        """Whether the GIL share is only bounded, and at 100% (its upper end rounds to it): a bound that says
        nothing, which the tables give as "not read" rather than "GIL ≤100%"."""
        b = self.gil_only_bounded
        return b is not None and b[1] >= 0.995

    @property
    def gil_read_directly(self) -> bool:
        """Whether the GIL probe's reading (a counter thread beside the stage) decided the GIL share, not
        the curves' signals (:func:`stagebench.analysis._gil.estimate_gil`)."""
        return self.gil is not None and self.gil.source == "probe"

    @property
    def user_choice(self) -> tuple[str, int] | None:
        """The user's own (executor, concurrency) of a pipe stage (:func:`own_choice`), or None."""
        return own_choice(self.user_executor, self.user_concurrency, self.type)

    def alternative(self, executor: str) -> StageSetting | None:
        """The best setting measured on ``executor`` (None where it was not measured)."""
        return self.alternatives[executor] if executor in self.alternatives else None

    def curve(self, key: str) -> tuple[StageSetting, ...]:
        """The points of the curve ``harness/executor`` (none where it was not measured)."""
        return self.curves[key] if key in self.curves else ()
